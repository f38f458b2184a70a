// sm_90a warpgroup MMA (wgmma): the fences, the group commit and wait, the shared-memory matrix
// descriptor of a K-major operand in the 128-byte swizzle, and the register-A product
// D[64 x N] += A[64 x 16] B[16 x N] for fp16 / bf16 with fp32 accumulators.
//
// Register A (wgmma's "RS" form): warp w of the warpgroup holds rows 16w..16w+15 of A in the
// m16n8k16 A-fragment layout (lane (g, t): {a0, a1, a2, a3} = rows g, g + 8 at k 2t..2t+1, then
// at k 2t+8..2t+9). D: lane (g, t) of warp w holds d[4j + e] = D[16w + g + 8 (e / 2)][8j + 2t +
// e % 2] for j < N / 8.
//
// B in shared memory, K-major (each of its N rows holds 16-bit elements contiguous along k), rows
// of 128 bytes (64 elements) whose 16-byte chunks are XOR-swizzled by (row % 8), from a
// 1024-byte-aligned base: the layout the 128-byte swizzle mode reads, with 8-row groups 1024
// bytes apart (stride byte offset). A k16 step inside the 64-wide row moves the start address
// by 32 bytes (desc + 2).
//
// Only sm_90a has these instructions: elsewhere every helper traps (the dispatch never launches
// a wgmma kernel off sm_90, see marlin's plan_gemm).
#pragma once

#include <cstdint>

#include "common/gpu.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define APHRODITE_HAS_WGMMA 1
#else
#define APHRODITE_HAS_WGMMA 0
#endif

namespace aphrodite::wgmma {

/// Orders this thread's register writes (A fragments, accumulators) before the next wgmma.
__device__ __forceinline__ void fence() {
#if APHRODITE_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void commit() {
#if APHRODITE_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
#if APHRODITE_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

/// Sets this warpgroup's registers per thread to kRegs (a multiple of 8 in 24..256), raising
/// (kIncrease) or lowering the launch's share: a warp-specialized block gives its producer
/// warpgroup few and its consumers more. Every warp of the warpgroup executes it.
template <bool kIncrease, int kRegs>
__device__ __forceinline__ void set_max_registers() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg's range");
#if APHRODITE_HAS_WGMMA
  if constexpr (kIncrease) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  }
#else
  __trap();
#endif
}

/// Keeps the compiler from moving reads or writes of `x` across a fence or wait (a wgmma writes
/// its accumulators behind the compiler's back).
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }

/// The descriptor of a K-major operand at shared address `addr` (1024-byte aligned for the
/// swizzle's phase) in the 128-byte swizzle: start address >> 4 in bits 0..13, leading byte
/// offset 1 (unused by swizzled K-major layouts), stride byte offset 1024 >> 4 in bits 32..45,
/// base offset 0, layout type 1 (128-byte swizzle) in bits 62..63.
__device__ __forceinline__ uint64_t desc_k_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

/// D[64 x N] (+)= A[64 x 16] (registers) B[16 x N] (descriptor); d points at the thread's N / 2
/// accumulators; scale_d 0 overwrites D instead of adding.
template <typename T, int N>
struct WgmmaRs;

#if APHRODITE_HAS_WGMMA
// The accumulator operands: N / 2 floats, "+f" each, and their "%i" list in the instruction.
#define APHRODITE_WGMMA_ACC8(d, i)                                                            \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define APHRODITE_WGMMA_ACC32(d, i)                                                            \
  APHRODITE_WGMMA_ACC8(d, i), APHRODITE_WGMMA_ACC8(d, i + 8), APHRODITE_WGMMA_ACC8(d, i + 16), \
      APHRODITE_WGMMA_ACC8(d, i + 24)
#define APHRODITE_WGMMA_D16          \
  "%0, %1, %2, %3, %4, %5, %6, %7, " \
  "%8, %9, %10, %11, %12, %13, %14, %15"
#define APHRODITE_WGMMA_D32                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, "         \
  "%8, %9, %10, %11, %12, %13, %14, %15, "   \
  "%16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define APHRODITE_WGMMA_D64                    \
  APHRODITE_WGMMA_D32                          \
  ", %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, "   \
  "%48, %49, %50, %51, %52, %53, %54, %55, "   \
  "%56, %57, %58, %59, %60, %61, %62, %63"

// One specialization: the instruction m64n<N>k16 with accumulators D (their "%i" list) and their
// operands OUTS; A, DESC and SCALE name the operands that follow them.
#define APHRODITE_WGMMA_RS(TYPE, PTX, N, D, OUTS, A, DESC, SCALE)                                \
  template <>                                                                                    \
  struct WgmmaRs<TYPE, N> {                                                                      \
    __device__ static void mma(float* d, const uint32_t (&a)[4], uint64_t desc_b, int scale_d) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE                                     \
                   ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" D    \
                   "}, {" A "}, " DESC ", p, 1, 1, 0;\n}\n"                                      \
                   : OUTS                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));     \
    }                                                                                            \
  };

#define APHRODITE_WGMMA_ACC64(d) APHRODITE_WGMMA_ACC32(d, 0), APHRODITE_WGMMA_ACC32(d, 32)
#define APHRODITE_WGMMA_ACC16(d) APHRODITE_WGMMA_ACC8(d, 0), APHRODITE_WGMMA_ACC8(d, 8)
#define APHRODITE_WGMMA_RS_TYPE(TYPE, PTX)                                            \
  APHRODITE_WGMMA_RS(TYPE, PTX, 32, APHRODITE_WGMMA_D16, APHRODITE_WGMMA_ACC16(d),    \
                     "%16, %17, %18, %19", "%20", "%21")                              \
  APHRODITE_WGMMA_RS(TYPE, PTX, 64, APHRODITE_WGMMA_D32, APHRODITE_WGMMA_ACC32(d, 0), \
                     "%32, %33, %34, %35", "%36", "%37")                              \
  APHRODITE_WGMMA_RS(TYPE, PTX, 128, APHRODITE_WGMMA_D64, APHRODITE_WGMMA_ACC64(d),   \
                     "%64, %65, %66, %67", "%68", "%69")

APHRODITE_WGMMA_RS_TYPE(__half, "f16")
APHRODITE_WGMMA_RS_TYPE(__nv_bfloat16, "bf16")
// The helpers above are this header's alone.
#undef APHRODITE_WGMMA_RS_TYPE
#undef APHRODITE_WGMMA_RS
#undef APHRODITE_WGMMA_ACC64
#undef APHRODITE_WGMMA_ACC32
#undef APHRODITE_WGMMA_ACC16
#undef APHRODITE_WGMMA_ACC8
#undef APHRODITE_WGMMA_D64
#undef APHRODITE_WGMMA_D32
#undef APHRODITE_WGMMA_D16
#else
template <typename T, int N>
struct WgmmaRs {
  __device__ static void mma(float*, const uint32_t (&)[4], uint64_t, int) { __trap(); }
};
#endif

}  // namespace aphrodite::wgmma
