// FP8 E4M3 (OCP "e4m3fn": max 448, no infinities) conversions shared by every kernel that reads
// or writes fp8: the KV caches, fp8 quantization and attention. One place decides rounding and
// saturation: values are scaled, then converted with round-to-nearest-even and saturated to
// +-448 (NaN stays NaN). Stored as uint8_t so that headers need no fp8 type. Torch-free.
#pragma once

#include <cstdint>

#include "common/gpu.h"

#if !defined(USE_ROCM)
#include <cuda_fp8.h>
#endif

namespace aphrodite::fp8 {

/// The largest finite E4M3 value.
constexpr float kE4M3Max = 448.0f;

#if !defined(USE_ROCM)
/// @brief Rounds `x` to E4M3 (nearest even, saturating to +-448). Device code.
__device__ __forceinline__ uint8_t from_float(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

/// @brief Rounds `lo` and `hi` to E4M3 as from_float does, in one conversion (one instruction on
/// sm_89 and newer): `lo` in the low byte. Device code.
__device__ __forceinline__ uint16_t from_float2(float lo, float hi) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

/// @brief The value of an E4M3 byte as float. Device code.
__device__ __forceinline__ float to_float(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

/// @brief Stores `x / scale` as E4M3 (the KV cache and static quantization convention).
__device__ __forceinline__ uint8_t quantize(float x, float inv_scale) {
  return from_float(x * inv_scale);
}

/// @brief Reads an E4M3 byte back as `value * scale`.
__device__ __forceinline__ float dequantize(uint8_t v, float scale) { return to_float(v) * scale; }
#endif

}  // namespace aphrodite::fp8
