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

/// How a load asks the caches to treat its lines (load_hinted).
enum class CacheHint {
  kKeep,  ///< read again soon (a second pass over the same data): L1 evict_last, L2 evict_last
  kLast,  ///< this is the data's last read: L1 evict_first
};

/// One 16-byte load of a V with a cache hint where `pred` holds, zeros where it does not: a
/// predicated load, not a branch, so that code using the loaded value cannot be placed between
/// it and the loads after it. Before sm_80 (no L2 cache policies), on ROCm and for other sizes a
/// plain load under `if`.
template <CacheHint kHint, typename V>
__device__ __forceinline__ V load_hinted(const V* p, bool pred) {
#if !defined(USE_ROCM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(V) == 16) {
    static_assert(alignof(V) >= 16, "a .v4.u32 load needs 16-byte alignment");
    uint32_t r[4] = {0, 0, 0, 0};
    if constexpr (kHint == CacheHint::kKeep) {
      uint64_t policy;
      asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
          " @p ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %6;\n}"
          : "+r"(r[0]), "+r"(r[1]), "+r"(r[2]), "+r"(r[3])
          : "l"(p), "r"(static_cast<int>(pred)), "l"(policy));
    } else {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
          " @p ld.global.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
          : "+r"(r[0]), "+r"(r[1]), "+r"(r[2]), "+r"(r[3])
          : "l"(p), "r"(static_cast<int>(pred)));
    }
    V v;
    __builtin_memcpy(&v, r, 16);
    return v;
  }
#endif
  V v{};
  if (pred) v = *p;
  return v;
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
