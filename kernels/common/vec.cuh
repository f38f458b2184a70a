// Element conversions and vector types every GPU kernel uses: N consecutive elements moved
// with one load or store, and fp32 <-> element conversions (round to nearest even). Device
// code, torch-free; include after common/gpu.h.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// Hides v's value from the optimiser (an empty asm that may "change" each of its 32-bit words),
/// so that copies made of it before this point (e.g. fp32 conversions for a reduction) are not
/// kept alive after it, and what follows recomputes from v itself. Types whose size is not a
/// multiple of 4 bytes (and every value on ROCm) are left as they are.
template <typename V>
__device__ __forceinline__ void launder(V& v) {
#if !defined(USE_ROCM)
  if constexpr (sizeof(V) % 4 == 0) {
    uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (size_t i = 0; i < sizeof(V) / 4; ++i) asm volatile("" : "+r"(words[i]));
  }
#endif
}

}  // namespace aphrodite
