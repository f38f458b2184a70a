// sm_90 asynchronous copies into shared memory that complete on an mbarrier: the mbarrier
// operations, the 2-D tiled tensor copy (TMA), and the host-side encoding of a 2-D tensor map
// (any element type; boxes row after row or in the 128-byte swizzle).
//
// A copy adds its bytes to the transaction count of the barrier it names; a phase of the barrier
// completes once its expected arrivals have arrived and the bytes announced with them
// (arrive_expect_tx) have landed. Waiting for a phase then makes those bytes visible to the
// waiting thread. Off sm_90 every device helper traps (callers never launch there).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/gpu.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define APHRODITE_HAS_TMA 1
#else
#define APHRODITE_HAS_TMA 0
#endif

namespace aphrodite::tma {

/// The shared-memory address of `p` (a pointer into shared memory), as PTX operands take it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Initialises the barrier at `bar` for `count` arrivals a phase (one thread, before any use; a
/// block barrier or init_fence() then publishes it).
__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
#if APHRODITE_HAS_TMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
#else
  __trap();
#endif
}

/// Makes the barriers initialised before it visible to the asynchronous copies.
__device__ __forceinline__ void init_fence() {
#if APHRODITE_HAS_TMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

/// One arrival on `bar`.
__device__ __forceinline__ void arrive(uint64_t* bar) {
#if APHRODITE_HAS_TMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

/// One arrival on `bar` that also announces `bytes` more bytes of copies for its phase.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if APHRODITE_HAS_TMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

/// Waits until the phase of `bar` with parity `parity` has completed (a freshly initialised
/// barrier counts the phase before its first, parity 1, as completed).
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
#if APHRODITE_HAS_TMA
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

/// Orders this thread's view of shared memory (generic-proxy writes it has seen) before its
/// later asynchronous copies into it.
__device__ __forceinline__ void fence_proxy_async() {
#if APHRODITE_HAS_TMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Copies the box of `map` (a kernel parameter: __grid_constant__) at element coordinates (x, y),
/// x the contiguous dimension, to shared `dst` (1024-byte aligned for the 128-byte swizzle),
/// completing on `bar`. Elements outside the tensor read as zero.
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, int x, int y,
                                        uint64_t* bar) {
#if APHRODITE_HAS_TMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();
#endif
}

/// Encodes `map` for a row-major [rows, cols] matrix of `type` elements at `base` (16-byte
/// aligned) whose rows lie `row_bytes` apart (a multiple of 16), read in boxes of box_rows x
/// box_cols, elements outside the matrix as zero; `swizzle128`: the box lands in shared memory in
/// the 128-byte swizzle (box_cols x element bytes <= 128), else row after row as in global
/// memory. The driver's encoder is looked up once through the runtime (no link against the
/// driver library). Returns cudaErrorInvalidValue where the driver refuses.
inline cudaError_t encode_2d(CUtensorMap* map, const void* base, CUtensorMapDataType type,
                             uint64_t rows, uint64_t cols, uint64_t row_bytes, uint32_t box_rows,
                             uint32_t box_cols, bool swizzle128) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = []() -> Encode {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<Encode>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, steps,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace aphrodite::tma
