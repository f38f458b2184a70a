// Element conversions and vector types every GPU kernel uses: N consecutive elements moved
// with one load or store, and fp32 <-> element conversions (round to nearest even). Device
// code, torch-free; include after common/gpu.h.
#pragma once

#include <type_traits>

#include "common/gpu.h"

namespace aphrodite {

/// N consecutive elements moved with one load or store of sizeof(T) * N bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

/// v rounded to T (nearest even).
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "unsupported element type");
    return __float2bfloat16_rn(v);
  }
}

}  // namespace aphrodite
