// Torch binding of the moe_sum family: schema, input checks and backend kernels.
#include "moe/moe_sum.h"

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

void moe_sum(const at::Tensor& input, at::Tensor& output) {
  const char* op = "moe_sum";
  TORCH_CHECK(input.dim() == 3, op, ": input must be [num_tokens, topk, hidden], got shape ",
              input.sizes());
  const int64_t num_tokens = input.size(0);
  const int64_t topk = input.size(1);
  const int64_t hidden = input.size(2);
  TORCH_CHECK(output.dim() == 2 && output.size(0) == num_tokens && output.size(1) == hidden, op,
              ": output must be [num_tokens, hidden] = [", num_tokens, ", ", hidden,
              "], got shape ", output.sizes());
  const ScalarType dtype = kernel_dtype(op, "input", input);
  check_dtype(op, "output", output, input.scalar_type());
  check_same_device(op, "output", output, input);
  check_last_dim_contiguous(op, "input", input);
  check_last_dim_contiguous(op, "output", output);
  check_rows_distinct(op, "output", output, output.stride(0));
  // A token's rows of input as one row of their span (exact when output is a separate tensor).
  TORCH_CHECK(!rows_overlap(byte_rows(output, output.stride(0)),
                            byte_rows(input, num_tokens, (topk - 1) * input.stride(1) + hidden,
                                      input.stride(0))),
              op, ": output shares memory with input; pass tensors that do not overlap");
  const moe::MoeSumProblem p{output.data_ptr(), input.data_ptr(), num_tokens,      topk, hidden,
                             output.stride(0),  input.stride(0),  input.stride(1), dtype};
  if (num_tokens == 0 || hidden == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(hidden * topk, 1));
  at::parallel_for(0, num_tokens, grain,
                   [&](int64_t begin, int64_t end) { APHRODITE_CPU_CALL(moe_sum, p, begin, end); });
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, moe::launch_moe_sum(p, current_stream(input)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_moe_C, ops) { ops.def("moe_sum(Tensor input, Tensor! output) -> ()"); }

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_moe_C, m) { m.impl("moe_sum", &aphrodite::moe_sum); }
#endif
