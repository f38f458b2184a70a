// CPU FP8 E4M3 quantization (fp8_quant.h): the GPU kernels' arithmetic (an fp32 division by the
// scale, then cpu/fp8.h's encoder, the host twin of common/fp8.h), so that both backends store
// the same bytes. Compiled once per ISA (see vec.h).
#include <cmath>

#include "cpu/cpu_kernels.h"
#include "cpu/fp8.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

/// max |x[i]| over [0, n); NaN elements are ignored (as the GPU kernels' fmaxf does).
template <ScalarType T>
float absmax_row(const vec::storage_t<T>* x, int64_t n) {
  constexpr int L = vec::kLanes;
  // vmax(acc, v) keeps acc where v is NaN.
  vf a0{}, a1{};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = vec::vmax(a0, vec::vabs(vec::load<T>(x + i)));
    a1 = vec::vmax(a1, vec::vabs(vec::load<T>(x + i + L)));
  }
  for (; i + L <= n; i += L) a0 = vec::vmax(a0, vec::vabs(vec::load<T>(x + i)));
  if (i < n) a1 = vec::vmax(a1, vec::vabs(vec::load_partial<T>(x + i, n - i)));
  return vec::allmax(vec::vmax(a0, a1))[0];
}

/// out[i] = e4m3(x[i] / divisor) over [0, n).
template <ScalarType T>
void quantize_row(uint8_t* out, const vec::storage_t<T>* x, int64_t n, float divisor) {
  constexpr int L = vec::kLanes;
  const vf d = vec::bcast(divisor);
  int64_t i = 0;
  for (; i + L <= n; i += L) fp8::store_bytes(out + i, fp8::e4m3_bits(vec::load<T>(x + i) / d), L);
  if (i < n)
    fp8::store_bytes(out + i, fp8::e4m3_bits(vec::load_partial<T>(x + i, n - i) / d), n - i);
}

template <ScalarType T>
const vec::storage_t<T>* input_row(const fp8_quant::QuantProblem& p, int64_t t) {
  return static_cast<const vec::storage_t<T>*>(p.input) + t * p.input_row_stride;
}

template <ScalarType T>
float absmax_rows(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end) {
  float m = 0.0f;
  for (int64_t t = row_begin; t < row_end; ++t) {
    m = std::fmax(m, absmax_row<T>(input_row<T>(p, t), p.hidden));
  }
  return m;
}

template <ScalarType T>
void quantize_rows(const fp8_quant::QuantProblem& p, float divisor, int64_t row_begin,
                   int64_t row_end) {
  for (int64_t t = row_begin; t < row_end; ++t) {
    quantize_row<T>(p.out + t * p.out_row_stride, input_row<T>(p, t), p.hidden, divisor);
  }
}

template <ScalarType T>
void per_token_rows(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end) {
  for (int64_t t = row_begin; t < row_end; ++t) {
    const vec::storage_t<T>* x = input_row<T>(p, t);
    float amax = absmax_row<T>(x, p.hidden);
    if (p.scale_ub != nullptr) amax = std::fmin(amax, *p.scale_ub);
    const float scale = std::fmax(amax / fp8_quant::kFp8Max, fp8_quant::kMinPerTokenScale);
    p.scale[t] = scale;
    quantize_row<T>(p.out + t * p.out_row_stride, x, p.hidden, scale);
  }
}

}  // namespace

float fp8_absmax(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return absmax_rows<ScalarType::kFloat32>(p, row_begin, row_end);
    case ScalarType::kFloat16: return absmax_rows<ScalarType::kFloat16>(p, row_begin, row_end);
    case ScalarType::kBFloat16: return absmax_rows<ScalarType::kBFloat16>(p, row_begin, row_end);
  }
  return 0.0f;
}

void fp8_quantize(const fp8_quant::QuantProblem& p, float divisor, int64_t row_begin,
                  int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32:
      return quantize_rows<ScalarType::kFloat32>(p, divisor, row_begin, row_end);
    case ScalarType::kFloat16:
      return quantize_rows<ScalarType::kFloat16>(p, divisor, row_begin, row_end);
    case ScalarType::kBFloat16:
      return quantize_rows<ScalarType::kBFloat16>(p, divisor, row_begin, row_end);
  }
}

void fp8_per_token_quant(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return per_token_rows<ScalarType::kFloat32>(p, row_begin, row_end);
    case ScalarType::kFloat16: return per_token_rows<ScalarType::kFloat16>(p, row_begin, row_end);
    case ScalarType::kBFloat16: return per_token_rows<ScalarType::kBFloat16>(p, row_begin, row_end);
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
