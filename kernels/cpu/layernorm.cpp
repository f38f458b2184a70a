// CPU RMS normalisation, plain and fused with the residual add, computed in fp32.
// Compiled once per ISA (see vec.h).
#include <cmath>

#include "cpu/cpu_kernels.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

/// 1 / sqrt(mean + eps) for a row's sum of squares.
inline float inv_rms(float sum_sq, int64_t hidden, float epsilon) {
  return 1.0f / std::sqrt(sum_sq / static_cast<float>(hidden) + epsilon);
}

/// out[i] = T(x[i] * inv * w[i]) for i in [0, n). out may be x itself.
template <ScalarType T>
APHRODITE_VEC_INLINE void scale_row(vec::storage_t<T>* out, const vec::storage_t<T>* x,
                                    const vec::storage_t<T>* __restrict w, int64_t n, float inv) {
  constexpr int L = vec::kLanes;
  const vf s = vec::bcast(inv);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const vf x0 = vec::load<T>(x + i), x1 = vec::load<T>(x + i + L);
    const vf w0 = vec::load<T>(w + i), w1 = vec::load<T>(w + i + L);
    vec::store<T>(out + i, x0 * s * w0);
    vec::store<T>(out + i + L, x1 * s * w1);
  }
  for (; i + L <= n; i += L) vec::store<T>(out + i, vec::load<T>(x + i) * s * vec::load<T>(w + i));
  if (i < n) {
    const vf r = vec::load_partial<T>(x + i, n - i) * s * vec::load_partial<T>(w + i, n - i);
    vec::store_partial<T>(out + i, r, n - i);
  }
}

template <ScalarType T>
void rms_norm_rows(const layernorm::RmsNormProblem& p, int64_t row_begin, int64_t row_end) {
  using S = vec::storage_t<T>;
  constexpr int L = vec::kLanes;
  const int64_t n = p.hidden;
  const S* w = static_cast<const S*>(p.weight);
  for (int64_t t = row_begin; t < row_end; ++t) {
    const S* x = static_cast<const S*>(p.input) + t * p.input_row_stride;
    S* out = static_cast<S*>(p.out) + t * p.out_row_stride;
    // Sum of squares with four independent accumulators (fixed order: deterministic).
    vf a0{}, a1{}, a2{}, a3{};
    int64_t i = 0;
    for (; i + 4 * L <= n; i += 4 * L) {
      const vf v0 = vec::load<T>(x + i), v1 = vec::load<T>(x + i + L);
      const vf v2 = vec::load<T>(x + i + 2 * L), v3 = vec::load<T>(x + i + 3 * L);
      a0 = vec::fmadd(v0, v0, a0);
      a1 = vec::fmadd(v1, v1, a1);
      a2 = vec::fmadd(v2, v2, a2);
      a3 = vec::fmadd(v3, v3, a3);
    }
    for (; i + L <= n; i += L) {
      const vf v = vec::load<T>(x + i);
      a0 = vec::fmadd(v, v, a0);
    }
    if (i < n) {
      const vf v = vec::load_partial<T>(x + i, n - i);
      a1 = vec::fmadd(v, v, a1);
    }
    const float inv = inv_rms(vec::hsum((a0 + a1) + (a2 + a3)), n, p.epsilon);
    scale_row<T>(out, x, w, n, inv);
  }
}

template <ScalarType T>
void fused_add_rms_norm_rows(const layernorm::FusedAddRmsNormProblem& p, int64_t row_begin,
                             int64_t row_end) {
  using S = vec::storage_t<T>;
  constexpr int L = vec::kLanes;
  const int64_t n = p.hidden;
  const S* w = static_cast<const S*>(p.weight);
  for (int64_t t = row_begin; t < row_end; ++t) {
    S* __restrict x = static_cast<S*>(p.input) + t * p.input_row_stride;
    S* __restrict res = static_cast<S*>(p.residual) + t * p.residual_row_stride;
    // residual = T(x + residual); the sum of squares is taken over the rounded values.
    vf a0{}, a1{}, a2{}, a3{};
    int64_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
      const vf r0 = vec::store_rounded<T>(res + i, vec::load<T>(x + i) + vec::load<T>(res + i));
      const vf r1 =
          vec::store_rounded<T>(res + i + L, vec::load<T>(x + i + L) + vec::load<T>(res + i + L));
      a0 = vec::fmadd(r0, r0, a0);
      a1 = vec::fmadd(r1, r1, a1);
    }
    if (i + L <= n) {
      const vf r = vec::store_rounded<T>(res + i, vec::load<T>(x + i) + vec::load<T>(res + i));
      a2 = vec::fmadd(r, r, a2);
      i += L;
    }
    if (i < n) {
      const vf s = vec::load_partial<T>(x + i, n - i) + vec::load_partial<T>(res + i, n - i);
      const vf r = vec::store_rounded_partial<T>(res + i, s, n - i);  // zero in unused lanes
      a3 = vec::fmadd(r, r, a3);
    }
    const float inv = inv_rms(vec::hsum((a0 + a1) + (a2 + a3)), n, p.epsilon);
    scale_row<T>(x, res, w, n, inv);
  }
}

}  // namespace

void rms_norm(const layernorm::RmsNormProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32: rms_norm_rows<ScalarType::kFloat32>(p, row_begin, row_end); break;
    case ScalarType::kFloat16: rms_norm_rows<ScalarType::kFloat16>(p, row_begin, row_end); break;
    case ScalarType::kBFloat16: rms_norm_rows<ScalarType::kBFloat16>(p, row_begin, row_end); break;
  }
}

void fused_add_rms_norm(const layernorm::FusedAddRmsNormProblem& p, int64_t row_begin,
                        int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32:
      fused_add_rms_norm_rows<ScalarType::kFloat32>(p, row_begin, row_end);
      break;
    case ScalarType::kFloat16:
      fused_add_rms_norm_rows<ScalarType::kFloat16>(p, row_begin, row_end);
      break;
    case ScalarType::kBFloat16:
      fused_add_rms_norm_rows<ScalarType::kBFloat16>(p, row_begin, row_end);
      break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
