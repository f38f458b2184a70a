// Torch binding of the topk_softmax family: schema, input checks, fake and backend kernels.
#include "moe/topk_softmax.h"

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

void topk_softmax(at::Tensor& topk_weights, at::Tensor& topk_indices,
                  at::Tensor& token_expert_indices, const at::Tensor& gating_output,
                  bool renormalize) {
  const char* op = "topk_softmax";
  TORCH_CHECK(gating_output.dim() == 2, op,
              ": gating_output must be [num_tokens, num_experts], got shape ",
              gating_output.sizes());
  const int64_t num_tokens = gating_output.size(0);
  const int64_t num_experts = gating_output.size(1);
  TORCH_CHECK(topk_weights.dim() == 2 && topk_weights.size(0) == num_tokens, op,
              ": topk_weights must be [", num_tokens, ", k], got shape ", topk_weights.sizes());
  const int64_t k = topk_weights.size(1);
  TORCH_CHECK(k >= 1 && k <= num_experts, op, ": k (topk_weights.size(1)) must be in [1, ",
              num_experts, "] for ", num_experts, " experts, got ", k);
  const std::vector<int64_t> shape{num_tokens, k};
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"topk_indices", topk_indices},
        {"token_expert_indices", token_expert_indices}}) {
    TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), op, ": ", name, " must have shape ", shape,
                ", got ", t.sizes());
    check_dtype(op, name, t, at::kInt);
    TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
    check_same_device(op, name, t, gating_output);
  }
  check_dtype(op, "topk_weights", topk_weights, at::kFloat);
  TORCH_CHECK(topk_weights.is_contiguous(), op, ": topk_weights must be contiguous");
  check_same_device(op, "topk_weights", topk_weights, gating_output);
  const moe::TopkSoftmaxProblem p{topk_weights.data_ptr<float>(),
                                  topk_indices.data_ptr<int32_t>(),
                                  token_expert_indices.data_ptr<int32_t>(),
                                  gating_output.data_ptr(),
                                  num_tokens,
                                  num_experts,
                                  k,
                                  row_stride(op, "gating_output", gating_output),
                                  renormalize,
                                  kernel_dtype(op, "gating_output", gating_output)};
  TORCH_CHECK(num_tokens * k <= INT32_MAX, op,
              ": num_tokens * k must fit token_expert_indices' int32, got ", num_tokens * k);
  if (num_tokens == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  at::parallel_for(
      0, num_tokens, std::max<int64_t>(1, 4096 / num_experts),
      [&](int64_t begin, int64_t end) { APHRODITE_CPU_CALL(topk_softmax, p, begin, end); });
#else
  const c10::cuda::OptionalCUDAGuard guard(gating_output.device());
  check_launch(op, moe::launch_topk_softmax(p, current_stream(gating_output)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_moe_C, ops) {
  ops.def(
      "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
      "Tensor gating_output, bool renormalize=False) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_moe_C, m) { m.impl("topk_softmax", &aphrodite::topk_softmax); }
#endif
