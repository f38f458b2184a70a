// Torch binding of the fp8_quant family: schemas (vLLM's), input checks and the backend kernels.
#include "fp8_quant/fp8_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

/// Checks result against input and describes both as a problem (scales filled in by the op).
fp8_quant::QuantProblem check_quant_inputs(const char* op, at::Tensor& result,
                                           const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension");
  TORCH_CHECK(result.sizes() == input.sizes(), op, ": result must have the shape of input ",
              input.sizes(), ", got ", result.sizes());
  check_same_device(op, "result", result, input);
  check_dtype(op, "result", result, at::kFloat8_e4m3fn);
  fp8_quant::QuantProblem p{};
  p.dtype = kernel_dtype(op, "input", input);
  p.out = static_cast<uint8_t*>(result.data_ptr());
  p.input = input.data_ptr();
  p.num_tokens = c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
  p.hidden = input.size(-1);
  check_row_length(op, p.hidden);
  p.out_row_stride = row_stride(op, "result", result);
  p.input_row_stride = row_stride(op, "input", input);
  check_rows_distinct(op, "result", result, p.out_row_stride);
  check_no_overlap(op, "result", result, p.out_row_stride, "input", input, p.input_row_stride,
                   /*in_place=*/false);
  return p;
}

/// A float32 scale tensor of `numel` elements on input's device.
void check_scale(const char* op, const char* arg, const at::Tensor& scale, const at::Tensor& input,
                 int64_t numel, const char* expected_shape) {
  check_same_device(op, arg, scale, input);
  check_dtype(op, arg, scale, at::kFloat);
  TORCH_CHECK(scale.numel() == numel && scale.is_contiguous(), op, ": ", arg,
              " must be a contiguous float32 tensor of shape ", expected_shape, " (", numel,
              " element(s)), got shape ", scale.sizes(), " strides ", scale.strides());
}

#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
int64_t cpu_grain(const char* op, int64_t hidden) {
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1));
}

/// Quantizes every row of p with `divisor`, rows spread over torch's thread pool.
void cpu_quantize(const char* op, const fp8_quant::QuantProblem& p, float divisor) {
  at::parallel_for(0, p.num_tokens, cpu_grain(op, p.hidden), [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(fp8_quantize, p, divisor, begin, end);
  });
}
#endif

void static_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input, const at::Tensor& scale) {
  const char* op = "static_scaled_fp8_quant";
  fp8_quant::QuantProblem p = check_quant_inputs(op, result, input);
  check_scale(op, "scale", scale, input, 1, "[1]");
  p.scale = static_cast<float*>(scale.data_ptr());
  if (p.num_tokens == 0 || p.hidden == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  cpu_quantize(op, p, *p.scale);
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, fp8_quant::launch_static_scaled_fp8_quant(p, current_stream(input)));
#endif
#endif
}

void dynamic_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input, at::Tensor& scale) {
  const char* op = "dynamic_scaled_fp8_quant";
  fp8_quant::QuantProblem p = check_quant_inputs(op, result, input);
  check_scale(op, "scale", scale, input, 1, "[1]");
  p.scale = static_cast<float*>(scale.data_ptr());
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  // Max is exact and order-free, so the threads' split does not change the result.
  const float amax = at::parallel_reduce(
      0, p.num_tokens, cpu_grain(op, p.hidden), 0.0f,
      [&](int64_t begin, int64_t end, float m) {
        return std::fmax(m, APHRODITE_CPU_CALL(fp8_absmax, p, begin, end));
      },
      [](float a, float b) { return std::fmax(a, b); });
  // As the GPU kernels: an all-zero input gets scale 0 and is divided by 1.
  const float tensor_scale = amax / fp8_quant::kFp8Max;
  *p.scale = tensor_scale;
  cpu_quantize(op, p, tensor_scale > 0.0f ? tensor_scale : 1.0f);
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  // Scratch for the per-block maxima of the two-kernel path, from torch's caching allocator
  // (stream-ordered, so it may be reused as soon as the quantization kernel is queued).
  at::Tensor workspace;
  const int64_t workspace_floats = fp8_quant::dynamic_scaled_fp8_quant_workspace(p);
  if (workspace_floats > 0) {
    workspace = at::empty({workspace_floats}, input.options().dtype(at::kFloat));
    p.workspace = workspace.data_ptr<float>();
  }
  check_launch(op, fp8_quant::launch_dynamic_scaled_fp8_quant(p, current_stream(input)));
#endif
#endif
}

void dynamic_per_token_scaled_fp8_quant(at::Tensor& result, const at::Tensor& input,
                                        at::Tensor& scale,
                                        const std::optional<at::Tensor>& scale_ub) {
  const char* op = "dynamic_per_token_scaled_fp8_quant";
  fp8_quant::QuantProblem p = check_quant_inputs(op, result, input);
  check_scale(op, "scale", scale, input, p.num_tokens, "[num_tokens, 1]");
  p.scale = static_cast<float*>(scale.data_ptr());
  if (scale_ub.has_value()) {
    check_scale(op, "scale_ub", *scale_ub, input, 1, "[1]");
    p.scale_ub = static_cast<const float*>(scale_ub->data_ptr());
  }
  if (p.num_tokens == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  at::parallel_for(0, p.num_tokens, cpu_grain(op, p.hidden), [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(fp8_per_token_quant, p, begin, end);
  });
#else
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, fp8_quant::launch_dynamic_per_token_scaled_fp8_quant(p, current_stream(input)));
#endif
#endif
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def("static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale) -> ()");
  ops.def("dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()");
  ops.def(
      "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, "
      "Tensor? scale_ub) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("static_scaled_fp8_quant", &aphrodite::static_scaled_fp8_quant);
  m.impl("dynamic_scaled_fp8_quant", &aphrodite::dynamic_scaled_fp8_quant);
  m.impl("dynamic_per_token_scaled_fp8_quant", &aphrodite::dynamic_per_token_scaled_fp8_quant);
}
#endif
