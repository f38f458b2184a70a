// Torch binding of the moe_align family: schema, input checks and backend kernels.
#include "moe/moe_align.h"

#include <optional>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

void check_int32_output(const char* op, const char* name, const at::Tensor& t,
                        const at::Tensor& ref) {
  check_dtype(op, name, t, at::kInt);
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  check_same_device(op, name, t, ref);
}

void moe_align_block_size(const at::Tensor& topk_ids, int64_t num_experts, int64_t block_size,
                          at::Tensor& sorted_token_ids, at::Tensor& experts_ids,
                          at::Tensor& num_tokens_post_pad,
                          const std::optional<at::Tensor>& maybe_expert_map) {
  const char* op = "moe_align_block_size";
  TORCH_CHECK(topk_ids.dim() == 2, op, ": topk_ids must be [num_tokens, topk], got shape ",
              topk_ids.sizes());
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong, op,
              ": topk_ids must be Int or Long, got ", topk_ids.scalar_type());
  TORCH_CHECK(topk_ids.is_contiguous(), op, ": topk_ids must be contiguous");
  TORCH_CHECK(num_experts >= 1 && num_experts <= moe::kAlignMaxExperts, op,
              ": num_experts must be in [1, ", moe::kAlignMaxExperts, "], got ", num_experts);
  TORCH_CHECK(block_size >= 1 && block_size <= INT32_MAX, op, ": block_size must be in [1, ",
              INT32_MAX, "], got ", block_size);
  const int64_t numel = topk_ids.numel();
  const int64_t required = moe::align_required_capacity(numel, num_experts, block_size);
  TORCH_CHECK(required <= INT32_MAX, op, ": num_tokens * topk + min(that, num_experts) * ",
              "(block_size - 1) must fit int32, got ", required);
  check_int32_output(op, "sorted_token_ids", sorted_token_ids, topk_ids);
  check_int32_output(op, "experts_ids", experts_ids, topk_ids);
  check_int32_output(op, "num_tokens_post_pad", num_tokens_post_pad, topk_ids);
  TORCH_CHECK(sorted_token_ids.numel() >= required && sorted_token_ids.numel() <= INT32_MAX, op,
              ": sorted_token_ids must hold at least num_tokens * topk + min(that, num_experts) *"
              " (block_size - 1) = ",
              required, " entries (and at most INT32_MAX), got ", sorted_token_ids.numel());
  const int64_t blocks_needed = (required + block_size - 1) / block_size;
  TORCH_CHECK(experts_ids.numel() >= blocks_needed && experts_ids.numel() <= INT32_MAX, op,
              ": experts_ids must hold at least ceil(", required,
              " / block_size) = ", blocks_needed, " entries, got ", experts_ids.numel());
  TORCH_CHECK(num_tokens_post_pad.numel() == 1, op,
              ": num_tokens_post_pad must have one element, got shape ",
              num_tokens_post_pad.sizes());
  const int32_t* expert_map = nullptr;
  if (maybe_expert_map.has_value()) {
    const at::Tensor& map = *maybe_expert_map;
    check_int32_output(op, "maybe_expert_map", map, topk_ids);
    TORCH_CHECK(map.dim() == 1 && map.size(0) == num_experts, op,
                ": maybe_expert_map must be [num_experts] = [", num_experts, "], got shape ",
                map.sizes());
    expert_map = map.data_ptr<int32_t>();
  }
  const moe::MoeAlignProblem p{sorted_token_ids.data_ptr<int32_t>(),
                               experts_ids.data_ptr<int32_t>(),
                               num_tokens_post_pad.data_ptr<int32_t>(),
                               topk_ids.data_ptr(),
                               expert_map,
                               numel,
                               num_experts,
                               block_size,
                               sorted_token_ids.numel(),
                               experts_ids.numel(),
                               topk_ids.scalar_type() == at::kLong};
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  APHRODITE_CPU_CALL(moe_align_block_size, p);
#else
  const c10::cuda::OptionalCUDAGuard guard(topk_ids.device());
  check_launch(op, moe::launch_moe_align_block_size(p, current_stream(topk_ids)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_moe_C, ops) {
  ops.def(
      "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
      "Tensor! sorted_token_ids, Tensor! experts_ids, Tensor! num_tokens_post_pad, "
      "Tensor? maybe_expert_map) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_moe_C, m) { m.impl("moe_align_block_size", &aphrodite::moe_align_block_size); }
#endif
