// Torch binding of the activation family: schemas, input checks, fake and backend kernels.
#include "activation/activation.h"

#include <c10/util/accumulate.h>

#include "common/torch_binding.h"
#if defined(APHRODITE_BACKEND_CPU) && APHRODITE_FAMILY_BUILT
#include <ATen/Parallel.h>

#include "cpu/cpu_isa.h"
#endif

namespace aphrodite {
namespace {

activation::Problem make_problem(const char* op, at::Tensor& out, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, op, ": input must have at least one dimension");
  const int64_t width = input.size(-1);
  TORCH_CHECK(width % 2 == 0, op,
              ": the last dimension of input holds the two halves [x, gate] and must be even, "
              "got ",
              width);
  const int64_t d = width / 2;
  std::vector<int64_t> expected = input.sizes().vec();
  expected.back() = d;
  TORCH_CHECK(out.sizes() == at::IntArrayRef(expected), op, ": out must have shape ", expected,
              " for input of shape ", input.sizes(), ", got ", out.sizes());
  check_same_device(op, "out", out, input);
  const ScalarType dtype = kernel_dtype(op, "input", input);
  check_dtype(op, "out", out, input.scalar_type());
  const int64_t num_tokens = c10::multiply_integers(expected.begin(), expected.end() - 1);
  const int64_t out_stride = row_stride(op, "out", out);
  const int64_t input_stride = row_stride(op, "input", input);
  check_rows_distinct(op, "out", out, out_stride);
  // out may be the first half of input's rows (each element is read before it is written, by
  // the thread that writes it), nothing else of input.
  check_no_overlap(op, "out", out, out_stride, "input", input, input_stride, /*in_place=*/true);
  return {out.data_ptr(), input.data_ptr(), num_tokens, d, out_stride, input_stride, dtype};
}

void act_and_mul(activation::Kind kind, const char* op, at::Tensor& out, const at::Tensor& input) {
  const activation::Problem p = make_problem(op, out, input);
  if (p.num_tokens == 0 || p.d == 0) return;
#if APHRODITE_FAMILY_BUILT
#if defined(APHRODITE_BACKEND_CPU)
  TORCH_CHECK(cpu::active_isa().error.empty(), op, ": ", cpu::active_isa().error);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(p.d, 1));
  at::parallel_for(0, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    APHRODITE_CPU_CALL(act_and_mul, kind, p, begin, end);
  });
#else
  TORCH_CHECK(activation::has_act_and_mul(kind, p.dtype), op, ": ", to_string(p.dtype),
              " was left out of this build by its generator options "
              "(APHRODITE_GENERATOR_OPTIONS activation.dtypes=...)");
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  check_launch(op, activation::launch_act_and_mul(kind, p, current_stream(input)));
#endif
#endif
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(activation::Kind::kSilu, "silu_and_mul", out, input);
}
void gelu_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(activation::Kind::kGelu, "gelu_and_mul", out, input);
}
void gelu_tanh_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(activation::Kind::kGeluTanh, "gelu_tanh_and_mul", out, input);
}

}  // namespace
}  // namespace aphrodite

APHRODITE_DEFINE_OPS(_C, ops) {
  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("gelu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()");
}

#if APHRODITE_FAMILY_BUILT
APHRODITE_IMPL_OPS(_C, m) {
  m.impl("silu_and_mul", &aphrodite::silu_and_mul);
  m.impl("gelu_and_mul", &aphrodite::gelu_and_mul);
  m.impl("gelu_tanh_and_mul", &aphrodite::gelu_tanh_and_mul);
}
#endif
