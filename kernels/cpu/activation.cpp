// CPU gated activations: out[t, i] = act(x[t, i]) * x[t, d + i], computed in fp32.
// Compiled once per ISA (see vec.h).
#include "cpu/cpu_kernels.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using activation::Kind;

template <Kind K>
APHRODITE_VEC_INLINE vec::vf act(vec::vf x) {
  if constexpr (K == Kind::kSilu)
    return vec::silu(x);
  else if constexpr (K == Kind::kGelu)
    return vec::gelu(x);
  else
    return vec::gelu_tanh(x);
}

template <ScalarType T, Kind K>
void act_and_mul_rows(const activation::Problem& p, int64_t row_begin, int64_t row_end) {
  using S = vec::storage_t<T>;
  constexpr int L = vec::kLanes;
  const int64_t d = p.d;
  for (int64_t t = row_begin; t < row_end; ++t) {
    const S* __restrict x = static_cast<const S*>(p.input) + t * p.input_row_stride;
    const S* __restrict y = x + d;
    S* __restrict o = static_cast<S*>(p.out) + t * p.out_row_stride;
    int64_t i = 0;
    for (; i + 2 * L <= d; i += 2 * L) {
      const vec::vf a0 = vec::load<T>(x + i), a1 = vec::load<T>(x + i + L);
      const vec::vf b0 = vec::load<T>(y + i), b1 = vec::load<T>(y + i + L);
      vec::store<T>(o + i, act<K>(a0) * b0);
      vec::store<T>(o + i + L, act<K>(a1) * b1);
    }
    for (; i + L <= d; i += L)
      vec::store<T>(o + i, act<K>(vec::load<T>(x + i)) * vec::load<T>(y + i));
    if (i < d) {
      const int64_t n = d - i;
      const vec::vf r = act<K>(vec::load_partial<T>(x + i, n)) * vec::load_partial<T>(y + i, n);
      vec::store_partial<T>(o + i, r, n);
    }
  }
}

template <ScalarType T>
void dispatch_kind(Kind kind, const activation::Problem& p, int64_t row_begin, int64_t row_end) {
  switch (kind) {
    case Kind::kSilu: act_and_mul_rows<T, Kind::kSilu>(p, row_begin, row_end); break;
    case Kind::kGelu: act_and_mul_rows<T, Kind::kGelu>(p, row_begin, row_end); break;
    case Kind::kGeluTanh: act_and_mul_rows<T, Kind::kGeluTanh>(p, row_begin, row_end); break;
  }
}

}  // namespace

void act_and_mul(Kind kind, const activation::Problem& p, int64_t row_begin, int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32:
      dispatch_kind<ScalarType::kFloat32>(kind, p, row_begin, row_end);
      break;
    case ScalarType::kFloat16:
      dispatch_kind<ScalarType::kFloat16>(kind, p, row_begin, row_end);
      break;
    case ScalarType::kBFloat16:
      dispatch_kind<ScalarType::kBFloat16>(kind, p, row_begin, row_end);
      break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
