// Torch binding of the layernorm family: schemas, input checks, fake and backend kernels.
#include "layernorm/layernorm.h"

#include <c10/util/accumulate.h>

#include <cstdint>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

int64_t check_norm_inputs(const char* op, const char* out_name, const at::Tensor& out,
                          const at::Tensor& input, const at::Tensor& weight, double epsilon) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension");
  const int64_t hidden = input.size(-1);
  TORCH_CHECK(out.sizes() == input.sizes(), op, ": ", out_name, " must have the shape of input ",
              input.sizes(), ", got ", out.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == hidden, op, ": weight must have shape [",
              hidden, "] (the last dimension of input), got ", weight.sizes());
  TORCH_CHECK(weight.is_contiguous(), op, ": weight must be contiguous");
  check_same_device(op, out_name, out, input);
  check_same_device(op, "weight", weight, input);
  kernel_dtype(op, "input", input);
  check_dtype(op, out_name, out, input.scalar_type());
  check_dtype(op, "weight", weight, input.scalar_type());
  TORCH_CHECK(epsilon >= 0.0 && std::isfinite(epsilon), op,
              ": epsilon must be a finite number >= 0, got ", epsilon);
  check_row_length(op, hidden);
  return c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
}

#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
template <typename Fn>
void cpu_rows(const char* op, int64_t rows, int64_t hidden, const Fn& fn) {
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1));
  at::parallel_for(0, rows, grain, fn);
}
#endif

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, double epsilon) {
  const char* op = "rms_norm";
  const int64_t rows = check_norm_inputs(op, "result", out, input, weight, epsilon);
  const int64_t out_stride = row_stride(op, "result", out);
  const int64_t input_stride = row_stride(op, "input", input);
  check_rows_distinct(op, "result", out, out_stride);
  // In place (result is input) is fine: a row is read whole before it is written.
  check_no_overlap(op, "result", out, out_stride, "input", input, input_stride,
                   /*in_place=*/true);
  check_no_overlap(op, "result", out, out_stride, "weight", weight, weight.numel(),
                   /*in_place=*/false);
  const layernorm::RmsNormProblem p{out.data_ptr(),
                                    input.data_ptr(),
                                    weight.data_ptr(),
                                    rows,
                                    input.size(-1),
                                    out_stride,
                                    input_stride,
                                    static_cast<float>(epsilon),
                                    kernel_dtype(op, "input", input)};
  if (rows == 0 || p.hidden == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  cpu_rows(op, rows, p.hidden,
           [&](int64_t begin, int64_t end) { APHRODITE_CPU_CALL(rms_norm, p, begin, end); });
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, layernorm::launch_rms_norm(p, current_stream(input)));
#endif
#endif
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                        double epsilon) {
  const char* op = "fused_add_rms_norm";
  const int64_t rows = check_norm_inputs(op, "residual", residual, input, weight, epsilon);
  const int64_t input_stride = row_stride(op, "input", input);
  const int64_t residual_stride = row_stride(op, "residual", residual);
  // Both are written (input <- the normalized sum, residual <- the sum): they must be apart.
  check_rows_distinct(op, "input", input, input_stride);
  check_rows_distinct(op, "residual", residual, residual_stride);
  check_no_overlap(op, "input", input, input_stride, "residual", residual, residual_stride,
                   /*in_place=*/false);
  check_no_overlap(op, "input", input, input_stride, "weight", weight, weight.numel(),
                   /*in_place=*/false);
  check_no_overlap(op, "residual", residual, residual_stride, "weight", weight, weight.numel(),
                   /*in_place=*/false);
  const layernorm::FusedAddRmsNormProblem p{input.data_ptr(),
                                            residual.data_ptr(),
                                            weight.data_ptr(),
                                            rows,
                                            input.size(-1),
                                            input_stride,
                                            residual_stride,
                                            static_cast<float>(epsilon),
                                            kernel_dtype(op, "input", input)};
  if (rows == 0 || p.hidden == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  cpu_rows(op, rows, p.hidden, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(fused_add_rms_norm, p, begin, end);
  });
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, layernorm::launch_fused_add_rms_norm(p, current_stream(input)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.def(
      "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("rms_norm", &aphrodite::rms_norm);
  m.impl("fused_add_rms_norm", &aphrodite::fused_add_rms_norm);
}
#endif
