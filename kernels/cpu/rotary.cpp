// CPU rotary position embedding (rotary.h), in place on query and key, computed in fp32.
// Each token's cos/sin row is converted to fp32 once and reused for all of its heads.
// Compiled once per ISA (see vec.h).
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

template <std::size_t... I>
APHRODITE_VEC_INLINE vf swap_pairs(vf v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, static_cast<int>(I ^ 1)...);
}

/// (x[2i + 1], x[2i]) for every pair of lanes.
APHRODITE_VEC_INLINE vf swap_pairs(vf v) {
  return swap_pairs(v, std::make_index_sequence<vec::kLanes>{});
}

/// Converts n elements of dtype C to fp32.
template <ScalarType C>
void to_fp32(float* out, const vec::storage_t<C>* in, int64_t n) {
  constexpr int L = vec::kLanes;
  int64_t i = 0;
  for (; i + L <= n; i += L) vec::storeu(out + i, vec::load<C>(in + i));
  if (i < n) {
    vec::store_partial<ScalarType::kFloat32>(out + i, vec::load_partial<C>(in + i, n - i), n - i);
  }
}

/// Neox: x[i], x[i + half] for i < half, with cos c[i] and sin s[i].
template <ScalarType T>
APHRODITE_VEC_INLINE void rotate_halves(vec::storage_t<T>* x, const float* c, const float* s,
                                        int64_t half) {
  constexpr int L = vec::kLanes;
  vec::storage_t<T>* y = x + half;
  int64_t i = 0;
  for (; i + L <= half; i += L) {
    const vf x0 = vec::load<T>(x + i), x1 = vec::load<T>(y + i);
    const vf cv = vec::loadu(c + i), sv = vec::loadu(s + i);
    vec::store<T>(x + i, x0 * cv - x1 * sv);
    vec::store<T>(y + i, x1 * cv + x0 * sv);
  }
  if (i < half) {
    const int64_t n = half - i;
    const vf x0 = vec::load_partial<T>(x + i, n), x1 = vec::load_partial<T>(y + i, n);
    const vf cv = vec::load_partial<ScalarType::kFloat32>(c + i, n);
    const vf sv = vec::load_partial<ScalarType::kFloat32>(s + i, n);
    vec::store_partial<T>(x + i, x0 * cv - x1 * sv, n);
    vec::store_partial<T>(y + i, x1 * cv + x0 * sv, n);
  }
}

/// GPT-J: x[2i], x[2i + 1] for 2i < rot_dim, with c2 = (cos[i], cos[i]) and
/// s2 = (-sin[i], sin[i]) per pair: x * c2 + swap_pairs(x) * s2.
template <ScalarType T>
APHRODITE_VEC_INLINE void rotate_pairs(vec::storage_t<T>* x, const float* c2, const float* s2,
                                       int64_t rot_dim) {
  constexpr int L = vec::kLanes;  // even, so a vector never splits a pair
  int64_t i = 0;
  for (; i + L <= rot_dim; i += L) {
    const vf v = vec::load<T>(x + i);
    vec::store<T>(x + i, v * vec::loadu(c2 + i) + swap_pairs(v) * vec::loadu(s2 + i));
  }
  if (i < rot_dim) {
    const int64_t n = rot_dim - i;  // even
    const vf v = vec::load_partial<T>(x + i, n);
    const vf cv = vec::load_partial<ScalarType::kFloat32>(c2 + i, n);
    const vf sv = vec::load_partial<ScalarType::kFloat32>(s2 + i, n);
    vec::store_partial<T>(x + i, v * cv + swap_pairs(v) * sv, n);
  }
}

template <ScalarType T, ScalarType C>
void rotary_tokens(const rotary::RotaryProblem& p, int64_t token_begin, int64_t token_end) {
  using S = vec::storage_t<T>;
  using SC = vec::storage_t<C>;
  const int64_t rot = p.rot_dim;
  const int64_t half = rot / 2;
  // row: the token's cos (first half) and sin (second half) in fp32; c2/s2: GPT-J's per-lane
  // copies of them.
  std::vector<float> buf(static_cast<size_t>(3 * rot));
  float* row = buf.data();
  float* c2 = row + rot;
  float* s2 = c2 + rot;
  S* const query = static_cast<S*>(p.query);
  S* const key = static_cast<S*>(p.key);
  const SC* const cache = static_cast<const SC*>(p.cos_sin_cache);
  for (int64_t t = token_begin; t < token_end; ++t) {
    const int64_t at = t * p.positions_stride;
    const int64_t pos = p.positions_int32 ? static_cast<const int32_t*>(p.positions)[at]
                                          : static_cast<const int64_t*>(p.positions)[at];
    if (pos < 0 || pos >= p.max_position) continue;  // the binding has rejected these
    to_fp32<C>(row, cache + pos * p.cache_stride, rot);
    if (!p.is_neox) {
      for (int64_t i = 0; i < half; ++i) {
        c2[2 * i] = c2[2 * i + 1] = row[i];
        s2[2 * i] = -row[half + i];
        s2[2 * i + 1] = row[half + i];
      }
    }
    auto rotate = [&](S* head) {
      if (p.is_neox) {
        rotate_halves<T>(head, row, row + half, half);
      } else {
        rotate_pairs<T>(head, c2, s2, rot);
      }
    };
    for (int64_t h = 0; h < p.num_heads; ++h) {
      rotate(query + t * p.query_token_stride + h * p.query_head_stride);
    }
    if (key != nullptr) {
      for (int64_t h = 0; h < p.num_kv_heads; ++h) {
        rotate(key + t * p.key_token_stride + h * p.key_head_stride);
      }
    }
  }
}

}  // namespace

void rotary_embedding(const rotary::RotaryProblem& p, int64_t token_begin, int64_t token_end) {
  const bool cache_fp32 = p.cache_dtype == ScalarType::kFloat32;
  switch (p.dtype) {
    case ScalarType::kFloat32:
      rotary_tokens<ScalarType::kFloat32, ScalarType::kFloat32>(p, token_begin, token_end);
      break;
    case ScalarType::kFloat16:
      if (cache_fp32) {
        rotary_tokens<ScalarType::kFloat16, ScalarType::kFloat32>(p, token_begin, token_end);
      } else {
        rotary_tokens<ScalarType::kFloat16, ScalarType::kFloat16>(p, token_begin, token_end);
      }
      break;
    case ScalarType::kBFloat16:
      if (cache_fp32) {
        rotary_tokens<ScalarType::kBFloat16, ScalarType::kFloat32>(p, token_begin, token_end);
      } else {
        rotary_tokens<ScalarType::kBFloat16, ScalarType::kBFloat16>(p, token_begin, token_end);
      }
      break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
