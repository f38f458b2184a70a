// Vector helpers shared by the CPU kernels: fp32 vectors of the native width, loads and stores
// that convert bf16/fp16 storage to fp32 and back, and fast fp32 exp/erf/tanh/sigmoid.
//
// Every source under kernels/cpu/ is compiled once per ISA with -DAPHRODITE_CPU_ISA=<isa> and
// that ISA's -m flags. Everything here therefore lives in aphrodite::cpu::<isa>::vec, so the
// copies compiled with different flags never share a mangled name. GCC vector extensions are
// used throughout; the vector width follows the flags the file is compiled with (16 bytes for
// the baseline build, 32 for AVX2, 64 for AVX-512). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/scalar_type.h"

#if defined(__SSE__)
#include <immintrin.h>  // only the intrinsics of the ISA being compiled are used (see #ifs)
#endif

#ifndef APHRODITE_CPU_ISA
#error "APHRODITE_CPU_ISA must name the ISA this file is compiled for (scalar, avx2, avx512)"
#endif

#define APHRODITE_VEC_INLINE inline __attribute__((always_inline))

namespace aphrodite::cpu::APHRODITE_CPU_ISA::vec {

#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64;
#elif defined(__AVX__)
inline constexpr int kVecBytes = 32;
#else
inline constexpr int kVecBytes = 16;
#endif
/// fp32 lanes per vector.
inline constexpr int kLanes = kVecBytes / 4;

typedef float vf __attribute__((vector_size(kVecBytes)));
typedef int32_t vi __attribute__((vector_size(kVecBytes)));
typedef uint32_t vu __attribute__((vector_size(kVecBytes)));
typedef uint16_t vh __attribute__((vector_size(kVecBytes / 2)));  // kLanes 16-bit values

/// The storage type of one element of dtype T: fp32 as float, bf16/fp16 as their bits.
template <ScalarType T>
using storage_t = std::conditional_t<T == ScalarType::kFloat32, float, uint16_t>;

// Several unmasked AVX-512 intrinsics trip a GCC 12 -Wmaybe-uninitialized false positive
// (_mm512_undefined_*); their maskz forms with a full mask are used instead and compile to the
// same unmasked instructions.

// ------------------------------------------------------------------------------------------
// Basic vector operations.

APHRODITE_VEC_INLINE vf bcast(float x) { return vf{} + x; }
APHRODITE_VEC_INLINE vi bcasti(int32_t x) { return vi{} + x; }

APHRODITE_VEC_INLINE vf loadu(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
APHRODITE_VEC_INLINE void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

/// {0, 1, ..., kLanes - 1}.
APHRODITE_VEC_INLINE vi lane_ids() {
  vi r{};
  for (int i = 0; i < kLanes; ++i) r[i] = i;
  return r;
}

APHRODITE_VEC_INLINE vf as_f(vu x) { return (vf)x; }
APHRODITE_VEC_INLINE vf as_f(vi x) { return (vf)x; }
APHRODITE_VEC_INLINE vu as_u(vf x) { return (vu)x; }
APHRODITE_VEC_INLINE vi as_i(vf x) { return (vi)x; }

APHRODITE_VEC_INLINE vf vabs(vf x) { return as_f(as_u(x) & 0x7fffffffu); }
/// |mag| with the sign of sgn.
APHRODITE_VEC_INLINE vf copysign(vf mag, vf sgn) {
  return as_f((as_u(mag) & 0x7fffffffu) | (as_u(sgn) & 0x80000000u));
}
/// min(x, hi) and max(x, lo) that return x when x is NaN (MINPS/MAXPS return their second
/// operand when either is NaN).
APHRODITE_VEC_INLINE vf vmin(vf x, vf hi) {
#if defined(__AVX512F__)
  return _mm512_maskz_min_ps(static_cast<__mmask16>(0xffff), hi, x);
#elif defined(__AVX__)
  return _mm256_min_ps(hi, x);
#elif defined(__SSE__)
  return _mm_min_ps(hi, x);
#else
  return x > hi ? hi : x;
#endif
}
APHRODITE_VEC_INLINE vf vmax(vf x, vf lo) {
#if defined(__AVX512F__)
  return _mm512_maskz_max_ps(static_cast<__mmask16>(0xffff), lo, x);
#elif defined(__AVX__)
  return _mm256_max_ps(lo, x);
#elif defined(__SSE__)
  return _mm_max_ps(lo, x);
#else
  return x < lo ? lo : x;
#endif
}

/// a * b + c (contracted to one FMA where the ISA has one).
APHRODITE_VEC_INLINE vf fmadd(vf a, vf b, vf c) { return a * b + c; }

/// The rounding error of hi = x * x, i.e. x * x - hi exactly.
APHRODITE_VEC_INLINE vf square_err(vf x, vf hi) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(x, x, -hi);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(x, x, -hi);
#elif defined(__ARM_FEATURE_FMA)
  vf r;
  for (int i = 0; i < kLanes; ++i) r[i] = __builtin_fmaf(x[i], x[i], -hi[i]);
  return r;
#else
  // Dekker's split; this ISA has no FMA, so the compiler cannot contract the steps below.
  const vf c = x * 4097.0f;
  const vf xh = c - (c - x);
  const vf xl = x - xh;
  return ((xh * xh - hi) + (xh + xh) * xl) + xl * xl;
#endif
}

namespace detail {
template <int W, class V, std::size_t... I>
APHRODITE_VEC_INLINE V xor_lanes(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, static_cast<int>(I ^ W)...);
}
/// op folded over all lanes by a butterfly; every lane ends up holding the result.
template <class V, class Op>
APHRODITE_VEC_INLINE V allreduce(V v, Op op) {
  constexpr auto idx = std::make_index_sequence<kLanes>{};
  if constexpr (kLanes >= 16) v = op(v, xor_lanes<8>(v, idx));
  if constexpr (kLanes >= 8) v = op(v, xor_lanes<4>(v, idx));
  v = op(v, xor_lanes<2>(v, idx));
  return op(v, xor_lanes<1>(v, idx));
}
}  // namespace detail

/// Sum of all lanes (fixed butterfly order), in every lane.
APHRODITE_VEC_INLINE vf allsum(vf v) {
  return detail::allreduce(v, [](vf a, vf b) { return a + b; });
}
/// Max of all lanes, in every lane; NaN lanes are ignored unless all are NaN.
APHRODITE_VEC_INLINE vf allmax(vf v) {
  return detail::allreduce(v, [](vf a, vf b) { return b > a ? b : (a == a ? a : b); });
}
APHRODITE_VEC_INLINE vi allmax(vi v) {
  return detail::allreduce(v, [](vi a, vi b) { return b > a ? b : a; });
}
APHRODITE_VEC_INLINE float hsum(vf v) { return allsum(v)[0]; }

/// True if any lane of the comparison mask is set.
APHRODITE_VEC_INLINE bool any(vi m) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX__)
  return _mm256_movemask_ps((__m256)m) != 0;
#else
  int32_t a[kLanes];
  std::memcpy(a, &m, sizeof(m));
  int32_t r = 0;
  for (int i = 0; i < kLanes; ++i) r |= a[i];
  return r != 0;
#endif
}

/// Index of the lowest set lane of a comparison mask, or -1 if none is set.
APHRODITE_VEC_INLINE int first_set(vi m) {
#if defined(__AVX512F__)
  const unsigned bits = _mm512_test_epi32_mask((__m512i)m, (__m512i)m);
  return bits ? __builtin_ctz(bits) : -1;
#elif defined(__AVX__)
  const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps((__m256)m));
  return bits ? __builtin_ctz(bits) : -1;
#else
  for (int i = 0; i < kLanes; ++i)
    if (m[i]) return i;
  return -1;
#endif
}

APHRODITE_VEC_INLINE vi loadu(const int32_t* p) {
  vi v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
APHRODITE_VEC_INLINE void storeu(int32_t* p, vi v) { std::memcpy(p, &v, sizeof(v)); }

// ------------------------------------------------------------------------------------------
// Scalar conversions (exact; used for tails and tests).

APHRODITE_VEC_INLINE float bf16_to_f32(uint16_t h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
}
/// Round to nearest even; NaN stays NaN (quieted).
APHRODITE_VEC_INLINE uint16_t f32_to_bf16(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ------------------------------------------------------------------------------------------
// Vector conversions.

/// bf16 bits of f (round to nearest even; NaN quieted) in the low half of each 32-bit lane.
APHRODITE_VEC_INLINE vu bf16_round_bits(vf f) {
  const vu u = as_u(f);
  const vu rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return (f == f ? rounded : (u | 0x00400000u)) >> 16;
}
APHRODITE_VEC_INLINE vf bf16_to_f32(vh h) { return as_f(__builtin_convertvector(h, vu) << 16); }
APHRODITE_VEC_INLINE vh f32_to_bf16(vf f) {
  return __builtin_convertvector(bf16_round_bits(f), vh);
}

/// kLanes bf16 values from p, as fp32.
APHRODITE_VEC_INLINE vf load_bf16(const uint16_t* p) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_maskz_cvtepu16_epi32(
      static_cast<__mmask16>(0xffff), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return as_f((vu)w << 16);
#elif defined(__AVX2__)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return as_f((vu)w << 16);
#else
  vh h;
  std::memcpy(&h, p, sizeof(h));
  return bf16_to_f32(h);
#endif
}

/// Stores the low 16 bits of each lane of r (every lane must be <= 0xffff).
APHRODITE_VEC_INLINE void store_u16(uint16_t* p, vu r) {
#if defined(__AVX512F__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtepi32_epi16(static_cast<__mmask16>(0xffff), (__m512i)r));
#elif defined(__AVX2__)
  const __m256i x = (__m256i)r;
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
#else
  const vh h = __builtin_convertvector(r, vh);
  std::memcpy(p, &h, sizeof(h));
#endif
}

/// fp16 bits -> fp32, exact (subnormals, infinities and NaNs included; NaNs are quieted).
APHRODITE_VEC_INLINE vf f16_to_f32_soft(vh h16) {
  const vu h = __builtin_convertvector(h16, vu);
  const vu sign = (h & 0x8000u) << 16;
  const vu em = h & 0x7fffu;
  const vu normal = (em << 13) + ((127u - 15u) << 23);
  const vu special = (em << 13) | 0x7f800000u | ((vi)em > 0x7c00 ? vu{} + 0x00400000u : vu{});
  const vu sub = as_u(__builtin_convertvector((vi)em, vf) * 0x1p-24f);
  const vi e = (vi)em;
  const vu mag = e < 0x400 ? sub : (e >= 0x7c00 ? special : normal);
  return as_f(mag | sign);
}

/// fp32 -> fp16 bits, round to nearest even (overflow to inf, NaN quieted with its payload).
APHRODITE_VEC_INLINE vh f32_to_f16_soft(vf f) {
  const vu u = as_u(f);
  const vu sign = (u >> 16) & 0x8000u;
  const vu a = u & 0x7fffffffu;
  const vi ai = (vi)a;
  const vu nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  // Normal range: rebias the exponent, then round the 13 dropped bits to nearest even.
  const vu n = a - ((127u - 15u) << 23);
  const vu normal = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
  // Subnormal range: adding 0.5 leaves the value rounded to a multiple of 2^-24 in the
  // low mantissa bits (round to nearest even by the FPU).
  const vu sub = as_u(as_f(a) + 0.5f) - 0x3f000000u;
  const vu inf = vu{} + 0x7c00u;
  const vu mag = ai > 0x7f800000    ? nan
                 : ai >= 0x477ff000 ? inf  // >= 65520 rounds to inf
                 : ai < 0x38800000  ? sub  // < 2^-14
                                    : normal;
  return __builtin_convertvector(mag | sign, vh);
}

APHRODITE_VEC_INLINE vf f16_to_f32(vh h) {
#if defined(__AVX512F__)
  return _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xffff), (__m256i)h);
#elif defined(__F16C__) && defined(__AVX__)
  return _mm256_cvtph_ps((__m128i)h);
#else
  return f16_to_f32_soft(h);
#endif
}
APHRODITE_VEC_INLINE vh f32_to_f16(vf f) {
#if defined(__AVX512F__)
  return (vh)_mm512_maskz_cvtps_ph(static_cast<__mmask16>(0xffff), f,
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__F16C__) && defined(__AVX__)
  return (vh)_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return f32_to_f16_soft(f);
#endif
}

// ------------------------------------------------------------------------------------------
// Typed loads and stores: kLanes elements of dtype T <-> one fp32 vector.

template <ScalarType T>
APHRODITE_VEC_INLINE vf load(const storage_t<T>* p) {
  if constexpr (T == ScalarType::kFloat32) {
    return loadu(p);
  } else if constexpr (T == ScalarType::kBFloat16) {
    return load_bf16(p);
  } else {
    vh h;
    std::memcpy(&h, p, sizeof(h));
    return f16_to_f32(h);
  }
}

template <ScalarType T>
APHRODITE_VEC_INLINE void store(storage_t<T>* p, vf v) {
  if constexpr (T == ScalarType::kFloat32) {
    storeu(p, v);
  } else if constexpr (T == ScalarType::kBFloat16) {
    store_u16(p, bf16_round_bits(v));
  } else {
    const vh h = f32_to_f16(v);
    std::memcpy(p, &h, sizeof(h));
  }
}

/// Stores v rounded to T and returns the rounded values as fp32.
template <ScalarType T>
APHRODITE_VEC_INLINE vf store_rounded(storage_t<T>* p, vf v) {
  if constexpr (T == ScalarType::kFloat32) {
    storeu(p, v);
    return v;
  } else if constexpr (T == ScalarType::kBFloat16) {
    const vu r = bf16_round_bits(v);
    store_u16(p, r);
    return as_f(r << 16);
  } else {
    const vh h = f32_to_f16(v);
    std::memcpy(p, &h, sizeof(h));
    return f16_to_f32(h);
  }
}

/// Loads the first n (< kLanes) elements; the other lanes hold fill.
template <ScalarType T>
APHRODITE_VEC_INLINE vf load_partial(const storage_t<T>* p, int64_t n, float fill = 0.0f) {
  storage_t<T> tmp[kLanes] = {};
  std::memcpy(tmp, p, static_cast<size_t>(n) * sizeof(storage_t<T>));
  const vf v = load<T>(tmp);
  return lane_ids() < bcasti(static_cast<int32_t>(n)) ? v : bcast(fill);
}

/// Stores the first n (< kLanes) lanes.
template <ScalarType T>
APHRODITE_VEC_INLINE void store_partial(storage_t<T>* p, vf v, int64_t n) {
  storage_t<T> tmp[kLanes];
  store<T>(tmp, v);
  std::memcpy(p, tmp, static_cast<size_t>(n) * sizeof(storage_t<T>));
}

/// Stores the first n (< kLanes) lanes rounded to T; returns all lanes rounded as fp32.
template <ScalarType T>
APHRODITE_VEC_INLINE vf store_rounded_partial(storage_t<T>* p, vf v, int64_t n) {
  storage_t<T> tmp[kLanes];
  const vf r = store_rounded<T>(tmp, v);
  std::memcpy(p, tmp, static_cast<size_t>(n) * sizeof(storage_t<T>));
  return r;
}

// ------------------------------------------------------------------------------------------
// Transcendentals (fp32, branch-free, relative error ~1e-7). Coefficients are minimax fits
// made for this file.

/// e^x. Arguments below ln(2^-126) give 0, above 88.37 are clamped (result ~2.5e38); NaN
/// stays NaN.
APHRODITE_VEC_INLINE vf exp(vf x) {
  const float kLo = -87.3365447f;  // ln(2^-126)
  const float kHi = 88.37f;        // keeps round(x / ln2) <= 127
  const vf xc = vmax(vmin(x, bcast(kHi)), bcast(kLo));
  // n = round(x / ln2) through the 1.5 * 2^23 trick; its bits give the integer directly.
  const float kShift = 12582912.0f;
  const vf t = fmadd(xc, bcast(1.44269504088896341f), bcast(kShift));
  const vf n = t - kShift;
  const vi ni = as_i(t) - as_i(bcast(kShift));
  // r = x - n ln2 in two steps (ln2_hi has trailing zeros, so n * ln2_hi is exact).
  vf r = fmadd(n, bcast(-0.693359375f), xc);
  r = fmadd(n, bcast(2.12194440e-4f), r);
  // e^r on |r| <= ln2/2: 1 + r + r^2 (c2 + c3 r + ... + c6 r^4).
  vf q = bcast(1.38146116e-3f);
  q = fmadd(q, r, bcast(8.36871006e-3f));
  q = fmadd(q, r, bcast(4.16683890e-2f));
  q = fmadd(q, r, bcast(1.66665211e-1f));
  q = fmadd(q, r, bcast(4.99999940e-1f));
  const vf p = fmadd(fmadd(q, r, bcast(1.0f)), r, bcast(1.0f));
  const vf scale = as_f((ni + 127) << 23);
  const vf res = p * scale;
  return x < bcast(kLo) ? vf{} : res;
}

/// 1 / (1 + e^-x), as e / (1 + e) with e = e^-|x| for x < 0 so that nothing overflows and
/// the negative tail keeps its relative accuracy (down to e^-87.3, below which it is 0).
APHRODITE_VEC_INLINE vf sigmoid(vf x) {
  const vf e = exp(-vabs(x));
  const vf num = x < vf{} ? e : bcast(1.0f);
  return num / (1.0f + e);
}

/// x * sigmoid(x).
APHRODITE_VEC_INLINE vf silu(vf x) { return x * sigmoid(x); }

namespace detail {
/// erfc(a) for 0 <= a <= 10, given a^2 = s_hi + s_lo exactly. Relative error ~2e-7.
/// Form: erfc(a) = t e^(Q(t) - a^2), t = 1 / (1 + a/2), Q a polynomial in t - c0.
APHRODITE_VEC_INLINE vf erfc_core(vf a, vf s_hi, vf s_lo) {
  const vf t = 1.0f / fmadd(a, bcast(0.5f), bcast(1.0f));
  const vf v = t - 0.586956522f;
  vf q = bcast(-1.42871499e-1f);
  q = fmadd(q, v, bcast(1.41134605e-1f));
  q = fmadd(q, v, bcast(1.46611124e-1f));
  q = fmadd(q, v, bcast(-2.41378188e-1f));
  q = fmadd(q, v, bcast(-5.87369166e-2f));
  q = fmadd(q, v, bcast(2.94061363e-1f));
  q = fmadd(q, v, bcast(-2.93624010e-2f));
  q = fmadd(q, v, bcast(-4.07864690e-1f));
  q = fmadd(q, v, bcast(8.62610415e-2f));
  q = fmadd(q, v, bcast(1.36937821e+0f));
  q = fmadd(q, v, bcast(-5.53635001e-1f));
  // u = q - a^2 with its rounding error (two-sum), so that large a keep full accuracy. FMA
  // contraction of the product that formed s_hi into these sums changes nothing when that
  // product is exact (normal_cdf: s_hi = (x*x)/2); erf only needs erfc to absolute accuracy.
  const vf b = -s_hi;
  const vf u = q + b;
  const vf bv = u - q;
  const vf err = (q - (u - bv)) + (b - bv);
  const vf e = exp(u);
  return t * fmadd(e, err - s_lo, e);
}

/// Phi(x) = P(N(0,1) <= x) = erfc(-x / sqrt2) / 2, accurate in relative terms on both tails.
APHRODITE_VEC_INLINE vf normal_cdf(vf x) {
  const vf ax = vmin(vabs(x), bcast(14.0f));  // Phi(-14) is far below the fp32 range
  const vf a = ax * 0.707106781f;
  const vf sq = ax * ax;
  const vf half_ec = 0.5f * erfc_core(a, 0.5f * sq, 0.5f * square_err(ax, sq));
  return x < vf{} ? half_ec : 1.0f - half_ec;
}
}  // namespace detail

/// erf(x).
APHRODITE_VEC_INLINE vf erf(vf x) {
  const vf ax = vabs(x);
  // |x| < 0.8: x P(x^2).
  const vf x2 = x * x;
  vf p = bcast(-6.53534138e-4f);
  p = fmadd(p, x2, bcast(5.08514931e-3f));
  p = fmadd(p, x2, bcast(-2.68208198e-2f));
  p = fmadd(p, x2, bcast(1.12831131e-1f));
  p = fmadd(p, x2, bcast(-3.76126021e-1f));
  p = fmadd(p, x2, bcast(1.12837911e+0f));
  const vf small = x * p;
  // Otherwise 1 - erfc(|x|).
  const vf ac = vmin(ax, bcast(10.0f));
  const vf sq = ac * ac;
  const vf large = copysign(1.0f - detail::erfc_core(ac, sq, square_err(ac, sq)), x);
  return ax < bcast(0.8f) ? small : large;
}

/// tanh(x).
APHRODITE_VEC_INLINE vf tanh(vf x) {
  const vf ax = vabs(x);
  // |x| < 0.625: x + x^3 P(x^2).
  const vf x2 = x * x;
  vf p = bcast(-5.70497522e-3f);
  p = fmadd(p, x2, bcast(2.06390768e-2f));
  p = fmadd(p, x2, bcast(-5.37397116e-2f));
  p = fmadd(p, x2, bcast(1.33314416e-1f));
  p = fmadd(p, x2, bcast(-3.33332807e-1f));
  const vf small = fmadd(x * x2, p, x);
  // Otherwise 1 - 2 / (1 + e^(2|x|)) (tanh(9.1) rounds to 1).
  const vf e = exp(2.0f * vmin(ax, bcast(9.1f)));
  const vf large = copysign(1.0f - 2.0f / (1.0f + e), x);
  return ax < bcast(0.625f) ? small : large;
}

#if defined(__AVX2__)  // AVX-512 builds included
/// t[idx[i]] in lane i, for idx[i] in [0, 8) (only its low 3 bits are read).
APHRODITE_VEC_INLINE vf lookup8(const float* t, vi idx) {
#if defined(__AVX512F__)
  return _mm512_permutexvar_ps((__m512i)idx,
                               _mm512_maskz_loadu_ps(static_cast<__mmask16>(0x00ff), t));
#else
  return _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), (__m256i)idx);
#endif
}

/// Truncates each lane to an integer; NaN gives INT32_MIN (the x86 conversion).
APHRODITE_VEC_INLINE vi trunc_i(vf x) {
#if defined(__AVX512F__)
  return (vi)_mm512_maskz_cvttps_epi32(static_cast<__mmask16>(0xffff), x);
#else
  return (vi)_mm256_cvttps_epi32(x);
#endif
}

namespace detail {
/// Phi(-a) = erfc(a / sqrt2) / 2 on [0, 6): a degree-8 polynomial in r = a - c_k per interval
/// [0.75 k, 0.75 (k + 1)), c_k its midpoint; row i holds the r^i coefficients of k = 0..7.
/// Fitted for this file (weighted least squares iterated toward minimax relative error against
/// mpmath's erfc, coefficients rounded to fp32 and re-checked in fp32 Horner): relative error
/// <= 3.3e-7 for a < 4.5 and <= 3.7e-6 on [4.5, 6), where Phi(-a) < 3.4e-6 (absolute <= 4e-8
/// everywhere).
alignas(64) inline constexpr float kNormalTail[9][8] = {
    {3.538302481e-01f, 1.302945167e-01f, 3.039636090e-02f, 4.332448356e-03f, 3.690784506e-04f,
     1.853673712e-05f, 5.440420523e-07f, 9.275376911e-09f},
    {-3.718550801e-01f, -2.118766457e-01f, -6.878627837e-02f, -1.272418164e-02f, -1.341118943e-03f,
     -8.054044883e-05f, -2.755942887e-06f, -5.373246026e-08f},
    {6.972283125e-02f, 1.191806048e-01f, 6.448713690e-02f, 1.670048945e-02f, 2.263137139e-03f,
     1.661146816e-04f, 6.717673841e-06f, 1.511295125e-07f},
    {5.326043069e-02f, -9.379855357e-03f, -2.884010971e-02f, -1.249224041e-02f, -2.322504763e-03f,
     -2.149841312e-04f, -1.045695171e-05f, -2.744098140e-07f},
    {-1.661364362e-02f, -1.722511649e-02f, 2.770795720e-03f, 5.414584652e-03f, 1.582467114e-03f,
     1.940162620e-04f, 1.162199624e-05f, 3.603722973e-07f},
    {-6.741380785e-03f, 5.280041136e-03f, 3.287792904e-03f, -9.685424739e-04f, -7.199520478e-04f,
     -1.278197888e-04f, -9.757668522e-06f, -3.638068051e-07f},
    {2.636067569e-03f, 1.303979079e-03f, -1.394897117e-03f, -2.978800039e-04f, 1.934307656e-04f,
     6.201791984e-05f, 6.416285942e-06f, 2.975431528e-07f},
    {6.455365801e-04f, -8.129848284e-04f, -2.615516496e-05f, 2.241580223e-04f, -5.711072845e-06f,
     -2.128904089e-05f, -3.385981017e-06f, -2.042450262e-07f},
    {-3.058189468e-04f, -1.548993168e-05f, 1.459085470e-04f, -4.209282997e-05f, -1.601948679e-05f,
     4.220808933e-06f, 1.209747552e-06f, 9.227749587e-08f},
};
}  // namespace detail

/// Exact GELU: x Phi(x) = 0.5 x (1 + erf(x / sqrt2)). Phi from a table of polynomials
/// (a permute per coefficient instead of an exp and a division): Phi(x) = 1 - Phi(-|x|) for
/// x >= 0 (within 1 ulp of fp32 near 1), Phi(-|x|) in relative terms down to x = -6, and 0
/// below (Phi(-6) = 1e-9; torch's fp32 0.5 (1 + erf) is 0 from x = -5.6 on). NaN stays NaN.
APHRODITE_VEC_INLINE vf gelu(vf x) {
  const vf a = vmin(vabs(x), bcast(6.0f));  // NaN stays NaN
  vi k = trunc_i(a * (1.0f / 0.75f));       // NaN: INT32_MIN, read as interval 0
  k = k > 7 ? bcasti(7) : k;
  const vf r = a - fmadd(__builtin_convertvector(k, vf), bcast(0.75f), bcast(0.375f));
  const float* c = &detail::kNormalTail[0][0];
  vf p = lookup8(c + 8 * 8, k);
  for (int i = 7; i >= 0; --i) p = fmadd(p, r, lookup8(c + 8 * i, k));
  const vf tail = a >= bcast(6.0f) ? vf{} : p;
  return x * (x < vf{} ? tail : 1.0f - tail);
}
#else
/// Exact GELU: x Phi(x) = 0.5 x (1 + erf(x / sqrt2)).
APHRODITE_VEC_INLINE vf gelu(vf x) { return x * detail::normal_cdf(x); }
#endif

/// Tanh GELU: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as the
/// equal x sigmoid(2u), which does not cancel for negative x.
APHRODITE_VEC_INLINE vf gelu_tanh(vf x) {
  const float k0 = 0.797884561f;  // sqrt(2 / pi)
  const float k1 = 0.797884561f * 0.044715f;
  const vf two_u = x * fmadd(x * x, bcast(2.0f * k1), bcast(2.0f * k0));
  return x * sigmoid(two_u);
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA::vec
