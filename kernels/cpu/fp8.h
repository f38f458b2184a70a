// FP8 E4M3 (OCP "e4m3fn": bias 7, max 448, no infinities, S.1111.111 is NaN) for the CPU
// kernels: the host twin of kernels/common/fp8.h (which is device code). One encoder, on the
// bits of fp32 vectors, serves every CPU writer of fp8 (quantization, the KV caches): round to
// nearest even, saturate to +-448, NaN to 0x7f with its sign; the same bytes as the GPU's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and torch's float8_e4m3fn conversion of
// in-range values. One exact decode table serves every reader (paged attention).
//
// Compiled once per ISA like vec.h, so everything lives in aphrodite::cpu::<isa>::fp8.
// Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA::fp8 {

/// The E4M3 byte of each lane, in its low 8 bits (the other bits are 0).
APHRODITE_VEC_INLINE vec::vu e4m3_bits(vec::vf x) {
  using vec::vu;
  const vu bits = vec::as_u(x);
  const vu sign = (bits >> 24) & 0x80u;
  const vu mag = bits & 0x7fffffffu;
  // |x| >= 2^-6 (normal E4M3): drop 20 of the 23 mantissa bits, rounding to nearest even (a
  // carry moves into the exponent), then rebias the exponent from 127 to 7.
  const vu normal = ((mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20) - (120u << 3);
  // |x| < 2^-6 (subnormal E4M3, multiples of 2^-9): |x| * 2^9 < 8 is exact, and adding 2^23
  // rounds it to an integer (nearest even) held in the low mantissa bits; 8 is the smallest
  // normal's encoding.
  const vu subnormal = vec::as_u(vec::as_f(mag) * 512.0f + 8388608.0f) - 0x4b000000u;
  vu r = mag < 0x3c800000u ? subnormal : normal;
  r = mag >= 0x43e00000u ? vu{} + 0x7eu : r;  // |x| >= 448, infinities included: saturate
  r = mag > 0x7f800000u ? vu{} + 0x7fu : r;   // NaN
  return r | sign;
}

/// One value's E4M3 byte: the vector encoder on a broadcast, so scalar and vector writers
/// cannot disagree.
APHRODITE_VEC_INLINE uint8_t from_float(float x) {
  return static_cast<uint8_t>(e4m3_bits(vec::bcast(x))[0]);
}

/// kLanes bytes.
typedef uint8_t vb __attribute__((vector_size(vec::kLanes)));

/// Stores the low bytes of the first n (<= kLanes) lanes of r at p.
APHRODITE_VEC_INLINE void store_bytes(uint8_t* p, vec::vu r, int64_t n) {
  const vb bytes = __builtin_convertvector(r, vb);
  std::memcpy(p, &bytes, static_cast<size_t>(n));
}

/// Stores the low bytes of the first n (<= kLanes) lanes of r at p[0], p[stride], ...
APHRODITE_VEC_INLINE void store_bytes_strided(uint8_t* p, int64_t stride, vec::vu r, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j * stride] = static_cast<uint8_t>(r[j]);
}

/// The exact value of an E4M3 byte.
constexpr float e4m3_value(int b) {
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * static_cast<float>(man) * 0x1p-9f;  // subnormal: man / 8 * 2^-6
  float v = 1.0f + static_cast<float>(man) * 0.125f;
  for (int e = exp; e > 7; --e) v *= 2.0f;
  for (int e = exp; e < 7; ++e) v *= 0.5f;
  return sign * v;
}

/// Every byte's value, computed at compile time.
struct E4m3Table {
  float v[256];
  constexpr E4m3Table() : v() {
    for (int b = 0; b < 256; ++b) v[b] = e4m3_value(b);
  }
};
inline constexpr E4m3Table kE4m3Table;

/// The value of an E4M3 byte as float (exact).
APHRODITE_VEC_INLINE float to_float(uint8_t b) { return kE4m3Table.v[b]; }

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA::fp8
