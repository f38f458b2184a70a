// The W4A16 GEMM kernel template. Each generated translation unit (codegen/marlin.py) instantiates
// launch_gemm_instance<> for one (activation dtype, weight type, group mode, block shape).
//
// Structure (one thread block = k_warps x m_warps x n_warps warps; warp tile = 16*MT rows x 64
// columns; with k_warps > 1 the k groups of warps share the block's tile, each taking its own k
// steps of every stage, so that a block has more warps to hide latency without dequantizing any
// weight twice, and reduce through shared memory at the end):
//  - a 4-stage cp.async pipeline (6 stages for the 16-row decode block, 3 for the 128-row
//    block, to fit 99 KiB of shared memory) brings, per 64-deep k slice, the activations
//    (row-major, 16-byte chunks XOR-swizzled by row so ldmatrix is conflict-free), the packed
//    weight tiles (already in fragment order, see marlin.h)
//    and, for grouped scales, the <= 2 scale/zero rows the slice touches;
//  - per 16-deep k step a warp loads A fragments with ldmatrix.x4 and one 16-byte weight vector
//    per lane (one step ahead, in a register double buffer), dequantizes it in registers
//    ((code | magic) - (magic + zero)) * scale (fp16 takes every other code from bits 4..7 with
//    an HFMA2 by 1/16 instead of a shift), and issues MT x 8 mma.sync.m16n8k16 with fp32
//    accumulators. The 16-row decode block computes the transposed product instead (weights as
//    the A operand: 8 MMAs, 4 where at most 8 rows lie inside M; see `narrow`) and scales its
//    fp32 sums once a stage rather than every weight;
//  - work partition: the blocks of a row of blocks (blockIdx.y) share its (column tile, k slice)
//    units in equal contiguous ranges, tile-major: one block per tile, split-K (a tile's k slices
//    over `splits` blocks) or stream-K (as many blocks as are resident at once, each walking its
//    range across tile boundaries, so that every SM gets the same work whatever the tile count).
//    Where several blocks share a tile, each writes fp32 partials, and the last to arrive (a
//    counter in the workspace) sums them in a fixed order (deterministic), adds the bias, writes
//    the output and resets the counter to zero; a split-K grid the GPU holds at once (a
//    cooperative launch) with more than 8 rows a block (min(M, block rows)) has every block sum a
//    share of its tile once all have written (`spread`), and on sm_90 a split tile's blocks run as
//    a cluster and sum through their shared memory.
// The wgmma blocks (kWgmma, sm_90a only) keep this structure but replace the MMA step and the
// copies: per two k steps a warpgroup issues one batch of wgmma products, the dequantized weights
// as the register A of the transposed product and the stage's activations read in place as its
// B (compute_stage_wgmma); a third warpgroup, the producer, fills the pipeline by TMA, one thread
// walking the block's units on its own, and hands slots over through mbarriers
// (Config::kProducer, produce_segments; kernels/marlin/NOTES.md). The TMA-fed decode block
// (Engine::kMmaSyncTma, sm_90a only) keeps the decode block's mma.sync loop and takes the same
// producer as a fifth warp. Torch-free; sm_80 and newer (mma.sync bf16, cp.async, ldmatrix);
// Engine::kWgmma and Engine::kMmaSyncTma blocks sm_90a.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/per_device.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "marlin/marlin.h"

namespace aphrodite::marlin::detail {

constexpr int kMaxStages = 4;
constexpr int kDecodeStages = 6;
constexpr int kMaxSplits = 64;  ///< k slices a plan may split a tile into

/// A split tile's counter (GemmProblem::counters) counts its blocks' arrivals in its low
/// kArrivalCountBits and carries the launch's tag above them: each block adds the launch's
/// arrival step, (tag << kArrivalCountBits) | 1 with an odd tag, so that a counter zero at launch
/// holds j * step (mod 2^32) after j arrivals (j < 2^kArrivalCountBits: j in the low bits, j * tag
/// above them). Any other value at a block's arrival was there before the launch (gemm_kernel).
constexpr int kArrivalCountBits = 12;
constexpr uint32_t kArrivalCountMask = (1u << kArrivalCountBits) - 1;
/// Most blocks that may share a tile: the spread sum's two rounds of arrivals stay within the
/// count's bits (launch_gemm_instance checks).
constexpr int64_t kMaxContributors = int64_t{1} << (kArrivalCountBits - 1);
/// The fewest k slices a block's range (a split, a stream-K share) may hold where a column tile
/// has `slices`: the tile is then shared by at most slices / range blocks wholly inside it and one
/// at each end, kMaxContributors in all (launch_gemm_instance checks, plan_stream_k keeps to it).
constexpr int64_t min_range_slices(int64_t slices) {
  return (slices + kMaxContributors - 3) / (kMaxContributors - 2);
}

/// A launch's arrival step (GemmProblem::arrival_step): the tag is odd and moves by 2 from one
/// launch of the process to the next (mod 2^(32 - kArrivalCountBits)), so that the counts a
/// launch on another stream, or one stopped midway, leaves in a shared workspace do not read as
/// this launch's own (gemm_kernel's arrival check).
inline uint32_t next_arrival_step() {
  static std::atomic<uint32_t> launches{0};
  const uint32_t tag = 2 * launches.fetch_add(1, std::memory_order_relaxed) + 1;
  return (tag << kArrivalCountBits) | 1u;
}
/// Most blocks of a split tile that launch_gemm_instance runs as one cluster (the portable
/// cluster size); more splits reduce through global memory.
constexpr int kMaxClusterSplits = 8;
/// Dynamic shared memory a block may opt into on every target arch (sm_86, sm_89 and sm_120
/// stop at 99 KiB; sm_80 and sm_90 allow more).
constexpr int kSmemBudget = 96 * 1024;
constexpr int kBlockK = 64;                ///< k per pipeline stage
constexpr int kKSteps = kBlockK / kTileK;  ///< mma k steps per stage

template <typename T>
struct Traits;

template <>
struct Traits<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // two fp16 1024.0: 1024 + code is exact
  /// A code in bits 4..7 of a half: kMagic | code << 4 is 1024 + 16 code (exact), and one HFMA2
  /// by 1/16 (kSixteenth) plus -(64 + zero) gives code - zero exactly. -(64 + zero) is
  /// kHighBias | zero << 4 (two fp16 -64.0, whose mantissa steps are 1/16 of 64).
  static constexpr bool kHighNibbleFma = true;
  static constexpr uint32_t kSixteenth = 0x2c002c00u;  // two fp16 0.0625
  static constexpr uint32_t kHighBias = 0xd400d400u;   // two fp16 -64.0
  __device__ static T2 lows(T2 x) { return __low2half2(x); }
  __device__ static T2 highs(T2 x) { return __high2half2(x); }
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static float2 to_float2(T2 x) { return __half22float2(x); }
  __device__ static T2 float2_to(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};

template <>
struct Traits<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // two bf16 128.0: 128 + code is exact
  /// bf16's 7 mantissa bits cannot hold 16 code: every code is shifted down to bits 0..3.
  static constexpr bool kHighNibbleFma = false;
  static constexpr uint32_t kSixteenth = 0, kHighBias = 0;
  __device__ static T2 lows(T2 x) { return __low2bfloat162(x); }
  __device__ static T2 highs(T2 x) { return __high2bfloat162(x); }
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static float2 to_float2(T2 x) { return __bfloat1622float2(x); }
  __device__ static T2 float2_to(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
};

using tma::smem_addr;

/// The thread block cluster (sm_90): blocks in it and this block's rank (x, y), the
/// cluster-wide barrier (release / acquire: shared-memory writes before it are visible to every
/// block after it), and a 16-byte read of another block's shared memory (addr: this block's
/// address of the same variable). Without clusters (older archs) one block of rank 0.
__device__ __forceinline__ uint2 cluster_blocks_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint2 v;
  asm volatile(
      "mov.u32 %0, %%cluster_nctarank;\n"
      "mov.u32 %1, %%cluster_ctarank;\n"
      : "=r"(v.x), "=r"(v.y));
  return v;
#else
  return make_uint2(1, 0);
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr, uint32_t rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

/// A load of a counter in global memory with acquire semantics at GPU scope: what the blocks
/// that raised it (atom_add_acq_rel_gpu) stored before is visible after it.
__device__ __forceinline__ int ld_acquire_gpu(const int* addr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

/// Adds `v` to a counter in global memory with acquire-release semantics at GPU scope and
/// returns the value before. Issued by one thread after a block barrier, its release covers what
/// every thread of the block stored before the barrier (the pattern of cooperative groups' grid
/// sync: a fence in one thread after the barrier, not in each), and its acquire what the blocks
/// that raised the counter before it stored.
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* addr, uint32_t v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(addr), "r"(v)
               : "memory");
  return old;
}

/// Fails the launch: a store to address 0, which the GPU reports as an illegal address
/// (cudaErrorIllegalAddress) at the host's next synchronization, and which leaves the CUDA
/// context unusable, as any such fault does. Not a trap or a device-side assert, which would say
/// more: an assert is a function call, and a call anywhere in a kernel makes ptxas serialize its
/// wgmma (C7510; the 64-row wgmma block lost 20-28% to it on an H200), and a trap made ptxas
/// spill in the wgmma blocks (44 bytes in m64n256w, which spills none without it).
__device__ __forceinline__ void fail_launch() {
  asm volatile("st.global.b32 [%0], %1;\n" ::"l"(0ull), "r"(0) : "memory");
}

/// 16-byte global->shared copy that bypasses L1; copies zeros instead when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}

/// 16-byte global->shared copy, all 16 bytes read (the caller predicates it rather than
/// zero-filling). No L2 cache hint: with one (evict-first weights), ptxas 13.0 gave the copies an
/// odd uniform register as their 64-bit policy operand in some instantiations (the 32-row
/// grouped blocks, then the 16-row ones once their copy addresses became running pointers), an
/// illegal instruction at run time.
__device__ __forceinline__ void cp_async16_full(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

/// Two 8 x 8 matrices (row addresses from lanes 0..15): lane (g, t) gets row g, columns 2t and
/// 2t + 1 of each.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(p))
               : "memory");
}

/// ldmatrix_x2 with .trans (row addresses from lanes 0..15): lane l gets rows 2 (l % 4) and
/// 2 (l % 4) + 1 of column l / 4 of each of the two 8 x 8 matrices.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(p))
               : "memory");
}

/// ldmatrix_x4 with .trans: lane l gets rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4 of each
/// of the four 8 x 8 matrices (whose 8 row addresses lanes 8i..8i+7 give).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

/// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T2>
__device__ __forceinline__ uint32_t as_u32(T2 x) {
  return *reinterpret_cast<uint32_t*>(&x);
}
template <typename T2>
__device__ __forceinline__ T2 as_t2(uint32_t x) {
  return *reinterpret_cast<T2*>(&x);
}

/// Calls fn(c) for the chunks c = tid, tid + kThreads, ... below kChunks, unrolled: a copy loop
/// whose trip count the compiler cannot see becomes a few predicated copies.
template <int kChunks, int kThreads, typename Fn>
__device__ __forceinline__ void for_chunks(int tid, Fn&& fn) {
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    const int c = tid + i * kThreads;
    if (kChunks % kThreads == 0 || c < kChunks) fn(c);
  }
}

/// gemm_kernel's partition of `units` units over `workers` blocks: block x takes [start(x),
/// start(x + 1)) with start(x) = floor(x * units / workers), computed in 32 bits (no call into a
/// 64-bit division routine) as x * (units / workers) + x * (units % workers) / workers, which
/// holds for x <= workers <= units < 2^31 and workers * (units % workers) < 2^32
/// (launch_gemm_instance checks; true for any workers < 2^16, and for one block per tile).
struct Partition {
  uint32_t workers, quot, rem;
  __host__ __device__ Partition(uint32_t units, uint32_t w)
      : workers(w), quot(units / w), rem(units % w) {}
  __host__ __device__ uint32_t start(uint32_t x) const { return x * quot + x * rem / workers; }
  /// The blocks that share units [begin, end) (within one tile): [first, last], found by walking
  /// out from block x, whose range holds `begin` or starts inside [begin, end).
  __host__ __device__ void sharers(uint32_t x, uint32_t begin, uint32_t end, uint32_t& first,
                                   uint32_t& last) const {
    first = x;
    while (first > 0 && start(first) > begin) --first;
    last = x;
    while (last + 1 < workers && start(last + 1) < end) ++last;
  }
};

/// The tensor maps a producer block (Config::kProducer) copies a stage with (a kernel parameter):
/// the activations [M, K] in boxes of the block's rows x one 64-deep slice (128 bytes: the
/// 128-byte swizzle that wgmma and the decode block's ldmatrix read), the packed weights
/// [K / 16, N] as 8-byte elements in boxes of kKSteps k-tiles x the block's kNWarps tiles (2 KiB a
/// k-tile), and the scale and zero rows [groups, N] / [groups, N / 8] in boxes of 2 rows x the
/// block's columns (the second row is read only where a slice runs into the next group). Nothing
/// for the cp.async blocks, whose threads copy their stages themselves.
struct StageMaps {
  CUtensorMap a, b, scales, zeros;
};
struct NoMaps {};

/// The problem as the TMA-fed decode block's kernel takes it (KernelArgs): GemmProblem's pointers,
/// its sizes in 32 bits (launch_gemm_instance checks that they fit) and the arrival step, without
/// the fields only the host reads. The kernel widens it back into a GemmProblem, whose 64-bit index
/// arithmetic ptxas then does on values it knows to be sign-extended 32-bit ones.
struct KernelProblem {
  void* out;
  const void* a;
  const int32_t* b;
  const void* scales;
  const int32_t* zeros;
  const void* bias;
  float* partials;
  int32_t* counters;
  int32_t m, n, k, lda, ldc, group_size;
  uint32_t arrival_step;

  /// Whether p's sizes fit (the kernel's problem is 32-bit).
  static bool fits(const GemmProblem& p) {
    const int64_t most = INT32_MAX;
    return p.m <= most && p.n <= most && p.k <= most && p.lda <= most && p.ldc <= most &&
           p.group_size <= most;
  }
  static KernelProblem of(const GemmProblem& p) {
    return {p.out,
            p.a,
            p.b,
            p.scales,
            p.zeros,
            p.bias,
            p.partials,
            p.counters,
            static_cast<int32_t>(p.m),
            static_cast<int32_t>(p.n),
            static_cast<int32_t>(p.k),
            static_cast<int32_t>(p.lda),
            static_cast<int32_t>(p.ldc),
            static_cast<int32_t>(p.group_size),
            p.arrival_step};
  }
};

/// What gemm_kernel takes as its problem: KernelProblem for the TMA-fed decode block, GemmProblem
/// itself for the others. On an H200 (kernels/marlin/NOTES.md) the 32-bit problem ran the TMA-fed
/// block's M = 16 calls 0.4-2.7 us faster (8192 x 28672 43.4 against 46.0 us) and its M = 1 calls
/// within -0.3 to +0.6 us, while the 64-row wgmma block lost 1.0 us with it (M = 64,
/// 28672 x 8192), and it grew the cp.async decode block's registers (159 -> 163) and the 128-row
/// wgmma block's spills (124 -> 232 bytes).
template <Engine kEngine>
using KernelArgs = std::conditional_t<kEngine == Engine::kMmaSyncTma, KernelProblem, GemmProblem>;

__device__ __forceinline__ const GemmProblem& widen(const GemmProblem& p) { return p; }
__device__ __forceinline__ GemmProblem widen(const KernelProblem& kp) {
  GemmProblem p{};
  p.out = kp.out;
  p.a = kp.a;
  p.b = kp.b;
  p.scales = kp.scales;
  p.zeros = kp.zeros;
  p.bias = kp.bias;
  p.partials = kp.partials;
  p.counters = kp.counters;
  p.m = kp.m;
  p.n = kp.n;
  p.k = kp.k;
  p.lda = kp.lda;
  p.ldc = kp.ldc;
  p.group_size = kp.group_size;
  p.arrival_step = kp.arrival_step;
  return p;
}
template <Engine kEngine>
KernelArgs<kEngine> kernel_args(const GemmProblem& p) {
  if constexpr (kEngine == Engine::kMmaSyncTma) {
    return KernelProblem::of(p);
  } else {
    return p;
  }
}

template <bool kProducer>
using ProducerMaps = std::conditional_t<kProducer, StageMaps, NoMaps>;

/// One segment of a block's range of units (gemm_kernel): a k range of one column tile.
struct Segment {
  int col_block;    ///< the tile's column block; -1 once the range is done
  int stage_begin;  ///< k slices [stage_begin, stage_end) of the tile
  int stage_end;
  int contributors;  ///< blocks that share the tile's k slices
  int slot;          ///< this block's partial slot among them (in k order)
  int next_unit;     ///< where the block's range continues
  int unit_end;      ///< where it ends

  /// The first segment's range: this block's share of its row's column tiles x k slices of
  /// block_n x kBlockK (Partition over gridDim.x blocks).
  __device__ __forceinline__ void begin(const GemmProblem& p, int block_n) {
    const Partition part(units(p, block_n), gridDim.x);
    next_unit = static_cast<int>(part.start(blockIdx.x));
    unit_end = static_cast<int>(part.start(blockIdx.x + 1));
  }
  /// Moves on to the block's next segment (col_block -1 once its range is done): the rest of
  /// the current tile's k slices or of the block's range, whichever ends first, and the blocks
  /// that share the tile.
  __device__ __forceinline__ void next(const GemmProblem& p, int block_n) {
    const int unit = next_unit;
    if (unit >= unit_end) {
      col_block = -1;
      return;
    }
    const int num_stages = static_cast<int>((p.k + kBlockK - 1) / kBlockK);
    col_block = unit / num_stages;
    const int tile_unit0 = col_block * num_stages;
    uint32_t first, last;
    Partition(units(p, block_n), gridDim.x)
        .sharers(blockIdx.x, tile_unit0, tile_unit0 + num_stages, first, last);
    stage_begin = unit - tile_unit0;
    stage_end = min(unit_end - tile_unit0, num_stages);
    contributors = static_cast<int>(last - first + 1);
    slot = static_cast<int>(blockIdx.x - first);
    next_unit = tile_unit0 + stage_end;
  }
  /// A row of blocks' units: column tiles of block_n x k slices.
  __device__ __forceinline__ static uint32_t units(const GemmProblem& p, int block_n) {
    return static_cast<uint32_t>((p.n + block_n - 1) / block_n * ((p.k + kBlockK - 1) / kBlockK));
  }
};

/// A producer block's place in its ring of kStages pipeline slots (Config::kProducer): the
/// slot and the parity of the round it is in, which the slots' mbarriers take as their phase.
/// The producer and the consumers each walk the same sequence of stages with one.
template <int kStages>
struct PipeCursor {
  int slot = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void advance() {
    if (++slot == kStages) {
      slot = 0;
      parity ^= 1;
    }
  }
};

/// The most blocks that share one of `col_blocks` column tiles of `num_stages` k slices under
/// that partition: the fp32 partial slots a launch with `workers` blocks needs (each M x N, or
/// whole tiles for the 64-row wgmma block: GemmPlan::partial_floats).
inline int64_t max_contributors(int64_t col_blocks, int64_t num_stages, int64_t workers) {
  const Partition part(static_cast<uint32_t>(col_blocks * num_stages),
                       static_cast<uint32_t>(workers));
  int64_t most = 1;
  uint32_t x = 0;  // the block whose range holds the tile's first unit
  for (int64_t tile = 0; tile < col_blocks; ++tile) {
    const uint32_t begin = static_cast<uint32_t>(tile * num_stages);
    while (x + 1 < part.workers && part.start(x + 1) <= begin) ++x;
    uint32_t first, last;
    part.sharers(x, begin, begin + static_cast<uint32_t>(num_stages), first, last);
    if (last - first + 1 > most) most = last - first + 1;
  }
  return most;
}

/// Shared memory a wgmma block (sm_90 only, up to 227 KiB there) may take: its pipeline has as
/// many slots as fit (f16 uint4b8 grouped: 15 of 13 KiB for 32 rows, 11 of 18 KiB for 64, 7 of
/// 26 KiB for 128), so that the producer (Config::kProducer) runs up to that many stages ahead.
constexpr int kWgmmaSmemBudget = 200 * 1024;
/// The TMA-fed decode block (Engine::kMmaSyncTma) runs two to an SM: 8 slots of 12 KiB.
constexpr int kTmaDecodeSmemBudget = 100 * 1024;

/// Whether a block of `engine` with `block_rows` rows keeps its fp32 partial slots, where the last
/// block to arrive sums a split tile, in its accumulators' own order (whole tiles: the 64-row
/// wgmma block, gemm_kernel's epilogue) rather than in the tile's [M, N] order. The dispatch sizes
/// the slots by it (GemmPlan::partial_floats).
constexpr bool fragment_order_slots(Engine engine, int block_rows) {
  return engine == Engine::kWgmma && block_rows == 64;
}

/// Compile-time facts of one instantiation. kWgmma (sm_90a): the block is kMWarps warpgroups
/// (kMWarps = 2) of kNWarps = 4 warps that share all kBlockM rows; warpgroup r multiplies words
/// 2r and 2r + 1 of every lane's weight vector (sub-tiles 4r..4r+3 of each warp's 64 columns)
/// on the transposed product out^T = W^T a^T, the dequantized weights as wgmma's register A
/// (64 columns: 16 per warp) and the activations as its shared-memory B (kBlockM rows).
template <typename T, WeightType kWeight, bool kGrouped, int kMTiles, int kMWarps, int kNWarps,
          int kKWarps, Engine kEngine>
struct Config {
  static constexpr bool kWgmma = kEngine == Engine::kWgmma;
  /// A producer (warpgroup or warp) fills the pipeline by TMA (see kProducerThreads).
  static constexpr bool kProducer = kEngine != Engine::kMmaSync;
  static constexpr int kThreads = 32 * kMWarps * kNWarps * kKWarps;
  static constexpr int kWarpKSteps = kKSteps / kKWarps;  ///< k steps per warp per stage
  static_assert(kKSteps % kKWarps == 0, "k warps split a stage's k steps evenly");
  static constexpr int kBlockM = 16 * kMTiles * kMWarps;
  static constexpr int kBlockN = kTileN * kNWarps;
  static constexpr int kABytes = kBlockM * kBlockK * 2;
  static constexpr int kBBytes = kKSteps * kNWarps * kTileWords * 4;
  static constexpr int kSBytes = kGrouped ? 2 * kBlockN * 2 : 0;  // 2 scale rows
  static constexpr bool kZeros = kWeight == WeightType::kUint4;
  static constexpr int kZBytes = (kGrouped && kZeros) ? 2 * kBlockN / 2 : 0;  // 2 zero rows
  /// TMA writes the activations of a stage in the 128-byte swizzle (which is also what wgmma
  /// reads), whose phase is the address's bits 7..9: every stage starts on a 1024-byte boundary.
  static constexpr int kStageBytes =
      kProducer ? (kABytes + kBBytes + kSBytes + kZBytes + 1023) / 1024 * 1024
                : kABytes + kBBytes + kSBytes + kZBytes;
  static_assert(!kWgmma || (kMWarps == 2 && kNWarps == 4 && kKWarps == 1 &&
                            (kBlockM == 32 || kBlockM == 64 || kBlockM == 128)),
                "a wgmma block is 2 warpgroups of 4 warps, 32, 64 or 128 rows (wgmma n)");
  static_assert(kEngine != Engine::kMmaSyncTma ||
                    (kBlockM == 16 && kMWarps == 1 && kNWarps == 4 && kKWarps == 1),
                "the TMA-fed mma.sync block is the 16-row decode block");
  static constexpr int kBudget = kWgmma                           ? kWgmmaSmemBudget
                                 : kEngine == Engine::kMmaSyncTma ? kTmaDecodeSmemBudget
                                                                  : kSmemBudget;
  /// Decode blocks (16 rows) stream weights with little compute per byte: their run time is
  /// the weight bytes in flight per SM divided into the memory latency, so they get a deeper
  /// pipeline (6 stages, ~69 KiB: still 3 blocks per SM); taller blocks get 4 stages where
  /// they fit in kSmemBudget, else 3 (the 128-row block). A producer block (wgmma, TMA-fed
  /// decode) takes as many as fit its budget besides the alignment (1 KiB) and its barriers
  /// (at most 256 bytes).
  static constexpr int kStages = kProducer ? (kBudget - 1024 - 256) / kStageBytes
                                 : kBlockM <= 16 && kDecodeStages * kStageBytes <= kBudget
                                     ? kDecodeStages
                                 : kMaxStages * kStageBytes <= kBudget ? kMaxStages
                                                                       : 3;
  /// k warps > 1: the warps of k group r > 0 hand their accumulators to group 0 through shared
  /// memory after the main loop, one group per round (reusing the pipeline's buffers).
  static constexpr int kReduceBytes = kKWarps > 1 ? kMWarps * kNWarps * 32 * kMTiles * 32 * 4 : 0;
  static constexpr int kPipeBytes =
      kStages * kStageBytes > kReduceBytes ? kStages * kStageBytes : kReduceBytes;
  /// Split-K through a thread block cluster (sm_90, launch_gemm_instance) puts the block's tile
  /// of fp32 sums in its shared memory. A block asks for room for it where its pipeline holds
  /// less and its budget allows: the 64-row mma.sync block with one scale per channel has
  /// 64 KiB of stages, its tile 66 KiB (two an SM either way). (The wgmma blocks' pipelines,
  /// 15 x 13 KiB, 11 x 18 KiB and 7 x 26 KiB, hold their tiles of 33, 65 and 130 KiB.)
  /// Its rows are a few floats more than kBlockN apart: a warp's pair stores into rows a
  /// multiple of 32 banks apart would meet in 8 banks, 8 ways (8 wavefronts where 256 bytes take
  /// 2). A half-warp's stores cover 4 rows x 8 columns in the mma.sync layout (rows g, columns
  /// 2t), which 8 floats more a row spread over all 32 banks, and 8 rows x 4 columns in the wgmma
  /// layout (rows 2t + (g & 1)), which takes 4 (rows stay 16-byte aligned for the float4 sums).
  static constexpr int kTileSumStride = kBlockN + (kWgmma ? 4 : 8);
  static constexpr int kTileSumBytes = kBlockM * kTileSumStride * 4;
  static constexpr int kSmemBytes =
      (kTileSumBytes > kPipeBytes && kTileSumBytes <= kBudget) ? kTileSumBytes : kPipeBytes;
  static_assert(kSmemBytes <= kBudget, "a block shape's pipeline must fit every target arch");
  static_assert(!kProducer || kStages >= 3, "a producer needs slots to run ahead");
  static constexpr bool kClusterReduce = kTileSumBytes <= kSmemBytes;
  static constexpr bool kFragSlots = fragment_order_slots(kEngine, kBlockM);
  /// A producer block (kWgmma, kMmaSyncTma) has more threads than kThreads, the producer: one of
  /// its threads fills the pipeline (TMA: StageMaps), as far ahead of the consumers as kStages
  /// slots go, and hands each slot over through a pair of mbarriers (full: the stage's bytes have
  /// landed; empty: every consumer warp is done with it). The consumer warps (kThreads) spend no
  /// instructions on copies and wait at no block barrier a stage. A wgmma block's producer is a
  /// warpgroup, since registers are handed out by warpgroup there: the launch's 168 a thread (384
  /// threads), then the producer drops to kProducerRegisters and the consumers take
  /// kConsumerRegisters (setmaxnreg). The mma.sync block's is one warp, with the consumers'
  /// registers.
  static constexpr int kProducerThreads = kWgmma ? 128 : kProducer ? 32 : 0;
  static constexpr int kBlockThreads = kThreads + kProducerThreads;
  static constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
  /// setmaxnreg moves registers within the block's own pool (the launch's share a thread,
  /// rounded down to 8, times its threads): an increase beyond it would wait forever.
  static_assert(!kWgmma || 128 * kProducerRegisters + kThreads * kConsumerRegisters <=
                               kBlockThreads * ((65536 / kBlockThreads) & ~7),
                "the warpgroups' registers fit the block's pool");
  /// Dynamic shared memory to ask for: a producer block aligns its pipeline up to 1024 bytes,
  /// and keeps its 2 x kStages mbarriers past kSmemBytes.
  static constexpr int kBarrierBytes = kProducer ? 2 * kStages * 8 : 0;
  static constexpr int kSmemAlloc = kProducer ? kSmemBytes + 1024 + kBarrierBytes : kSmemBytes;
  /// Resident blocks per SM that ptxas plans registers for (__launch_bounds__): 3 for the 4-warp
  /// blocks of 16 and 32 rows (at most 170 registers), which shared memory allows 3 per SM on
  /// sm_90. Without it ptxas 13.0 gave the bf16 uint4b8 decode block 96 registers and a spill,
  /// and the 32-row blocks 187-208 registers (2 per SM).
  /// The TMA-fed decode block (5 warps, 8 slots of 12 KiB) runs two to an SM.
  static constexpr int kMinBlocks = kEngine == Engine::kMmaSyncTma     ? 2
                                    : kThreads == 128 && kBlockM <= 32 ? 3
                                                                       : 1;
  static_assert(kABytes % 16 == 0 && kBBytes % 16 == 0 && kSBytes % 16 == 0 && kZBytes % 16 == 0,
                "stage parts must stay 16-byte aligned");
};

/// The producer (a wgmma block's warpgroup, the TMA-fed decode block's warp; Config::kProducer):
/// one of its threads walks the block's range of units on its own (the consumers' segments,
/// back to back) and issues each stage's copies (StageMaps' boxes; rows and columns outside the
/// tensors read as zero: past M and K the activations meet nothing, and columns past N are never
/// stored) into the next slot the consumers have freed (their `empty` arrivals), completing on the
/// slot's `full` barrier. It meets the consumers at no block barrier, so that it runs on into a
/// block's next segment while the consumers finish the last one (stream-K: the pipeline does not
/// drain at a tile boundary); the consumers synchronise among themselves (sync_consumers). A
/// split summed in a cluster (the block's one segment) is the exception: every thread of the
/// cluster meets its two cluster barriers.
template <typename C, bool kGrouped>
__device__ __forceinline__ void produce_segments(const GemmProblem& p, const StageMaps& maps,
                                                 const FastDiv& group_div, unsigned char* smem,
                                                 uint64_t* full_bars, uint64_t* empty_bars) {
  const int m0 = static_cast<int>(blockIdx.y) * C::kBlockM;
  constexpr uint32_t kBytes = C::kABytes + C::kBBytes + (kGrouped ? C::kSBytes + C::kZBytes : 0);
  if (threadIdx.x == C::kThreads) {  // the issuing thread
    // The block's units in order (the consumers' segments, back to back): k slice `stage` of
    // column tile `col_block`.
    const int num_stages = static_cast<int>((p.k + kBlockK - 1) / kBlockK);
    Segment range;
    range.begin(p, C::kBlockN);
    const int unit_end = range.unit_end;
    int unit = range.next_unit;
    int col_block = unit / num_stages;
    int stage = unit - col_block * num_stages;
    PipeCursor<C::kStages> pipe;
#pragma unroll 1
    for (; unit < unit_end; ++unit) {
      const int n0 = col_block * C::kBlockN;
      tma::wait(empty_bars + pipe.slot, pipe.parity ^ 1);
      unsigned char* const base = smem + pipe.slot * C::kStageBytes;
      uint64_t* const full = full_bars + pipe.slot;
      tma::arrive_expect_tx(full, kBytes);
      tma::load_2d(base, &maps.a, stage * kBlockK, m0, full);
      tma::load_2d(base + C::kABytes, &maps.b, n0, stage * kKSteps, full);
      if constexpr (kGrouped) {
        const int row = static_cast<int>(group_div.div(stage * kBlockK));
        tma::load_2d(base + C::kABytes + C::kBBytes, &maps.scales, n0, row, full);
        if constexpr (C::kZeros) {
          tma::load_2d(base + C::kABytes + C::kBBytes + C::kSBytes, &maps.zeros, n0 / 8, row, full);
        }
      }
      pipe.advance();
      if (++stage == num_stages) {
        stage = 0;
        ++col_block;
      }
    }
  }
  // The consumers' epilogue (gemm_kernel) sums a split tile in a cluster, with two cluster
  // barriers, where the launch made the tile's blocks one (split-K: each block's only segment,
  // and every block of the cluster shares its tile).
  if constexpr (C::kClusterReduce) {
    if (cluster_blocks_rank().x > 1) {
      __syncwarp();
      cluster_sync();
      cluster_sync();
    }
  }
}

template <typename T, WeightType kWeight, bool kGrouped, int kMTiles, int kMWarps, int kNWarps,
          int kKWarps, Engine kEngine>
__global__ void __launch_bounds__(
    Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>::kBlockThreads,
    Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>::kMinBlocks)
    gemm_kernel(const KernelArgs<kEngine> kp, const FastDiv group_div,
                const __grid_constant__ ProducerMaps<kEngine != Engine::kMmaSync> maps,
                const bool spread) {
  // Launched with PDL (launch_gemm_instance), the blocks may start while the kernel before this
  // one runs: nothing here reads or writes global memory before its wait. Its trigger lets the
  // kernel after this one start as soon as every block of this grid has.
  pdl_prologue();
  using C = Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  const GemmProblem& p = widen(kp);
  constexpr bool kWgmma = C::kWgmma;
  using Tr = Traits<T>;
  using T2 = typename Tr::T2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // A producer block's pipeline starts at the next 1024-byte boundary (C::kSmemAlloc has room).
  unsigned char* const smem =
      C::kProducer ? smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  // Warp w = (warp_k * kMWarps + warp_m) * kNWarps + warp_n: the kKWarps groups of kMWarps x
  // kNWarps warps share every output tile and take disjoint k steps of each stage.
  const int warp_mn = kKWarps > 1 ? warp % (kMWarps * kNWarps) : warp;
  const int warp_k = kKWarps > 1 ? warp / (kMWarps * kNWarps) : 0;  // 0 known at compile time
  const int warp_m = warp_mn / kNWarps, warp_n = warp_mn % kNWarps;
  const int g = lane / 4, t = lane % 4;
  // The producer's pipeline barriers, past the pipeline: full[s] (one arrival, the producer's,
  // plus the stage's bytes) and empty[s] (one arrival per consumer warp). Both roles walk the
  // same sequence of stages over all segments (PipeCursor: slot `pipe.slot` in the round of
  // parity `pipe.parity`): a consumer waits for full's phase of that parity, the producer for
  // empty's phase before it (parity ^ 1: a fresh barrier's, so that the first round waits for
  // nothing).
  uint64_t* const full_bars = reinterpret_cast<uint64_t*>(smem + C::kSmemBytes);
  uint64_t* const empty_bars = full_bars + C::kStages;
  PipeCursor<C::kStages> pipe;
  __shared__ Segment seg;
  if constexpr (C::kProducer) {
    if (tid == 0) {
      for (int s = 0; s < C::kStages; ++s) {
        tma::init(full_bars + s, 1);
        tma::init(empty_bars + s, C::kThreads / 32);
      }
      tma::init_fence();
    }
    __syncthreads();  // the barriers are initialised before either role uses them
    // The warps past kThreads produce (a wgmma block's with few registers), the others consume
    // (with more); the role is warp-uniform by construction (a shuffle of lane 0's warp index),
    // so that ptxas keeps the consumers' wgmma products asynchronous.
    if (__shfl_sync(0xffffffffu, warp, 0) >= C::kThreads / 32) {
      if constexpr (kWgmma) wgmma::set_max_registers<false, C::kProducerRegisters>();
      produce_segments<C, kGrouped>(p, maps, group_div, smem, full_bars, empty_bars);
      return;
    }
    if constexpr (kWgmma) wgmma::set_max_registers<true, C::kConsumerRegisters>();
  }
  // The consumers' block barrier: a producer block's producer keeps to itself (produce_segments),
  // so its consumers meet on a named barrier of their own.
  auto sync_consumers = [] {
    if constexpr (C::kProducer) {
      asm volatile("bar.sync 1, %0;\n" ::"n"(C::kThreads) : "memory");
    } else {
      __syncthreads();
    }
  };

  // The work of a row of blocks (blockIdx.y) is its column tiles x num_stages k slices, as one
  // sequence of units (tile-major, k fastest) that its gridDim.x blocks share in equal
  // contiguous ranges: block x takes [x * units / workers, (x + 1) * units / workers). With
  // workers = column tiles x splits that is split-K (each block one tile, 1/splits of its k);
  // with workers = the blocks that are resident at once (stream-K) every SM gets the same
  // work, and a block may finish one tile's k range and start the next tile's. A tile whose
  // k range spans blocks first..last is summed in slot (x - first) order: through the blocks'
  // shared memory where they run as a cluster, else through fp32 partials in global memory, by
  // every block a share where the launch says `spread` (a split-K grid held at once), or by the
  // last of them to arrive.
  // Thread 0 works out each segment between two barriers and hands it over in shared memory:
  // no register holds partition state across the main loop, which the 64-row blocks'
  // accumulators need, and everything else a segment needs is derived inside the loop from the
  // launch's parameters, so that only the thread's indices stay live from one segment to the
  // next.
  if (tid == 0) seg.begin(p, C::kBlockN);

  // The segments of this block's range: a k range of one column tile each.
  for (;;) {
    sync_consumers();  // every warp is done with the previous segment's shared memory and `seg`
    if (tid == 0) seg.next(p, C::kBlockN);
    sync_consumers();
    const int col_block = seg.col_block;
    if (col_block < 0) break;
    const int stage_begin = seg.stage_begin;
    const int n_iters = seg.stage_end - stage_begin;
    const int64_t n0 = static_cast<int64_t>(col_block) * C::kBlockN;

    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * C::kBlockM;
    const int64_t n_tiles_total = p.n / kTileN;
    // K fits in 31 bits (launch_gemm_instance checks): the per-stage k arithmetic is 32-bit, so
    // no stage pays for a 64-bit division (a call into a slow path on the GPU).
    const int k_total = static_cast<int>(p.k);
    const int k_tiles_total = k_total / kTileK;
    // Grouped kernels divide by the group size (>= 32) through group_div (FastDiv: a
    // multiply-high and a shift): k slice `stage` starts in group group_div.div(stage * kBlockK).
    const int group_size = static_cast<int>(p.group_size);
    const int num_groups = kGrouped ? static_cast<int>(group_div.div(k_total)) : 1;
    const int group_tiles = group_size / kTileK;  // k steps per group

    const T* a = static_cast<const T*>(p.a);
    const T* scales = static_cast<const T*>(p.scales);

    // Pipeline slots are addressed by their byte offset in smem (slot * kStageBytes).

    // The activation copies of a stage: kBlockM rows x 8 chunks of 16 bytes, chunk c = tid + i *
    // kThreads at row c / 8, column chunk c % 8. Since kThreads is a multiple of 64, a thread's
    // column chunk and its rows' XOR swizzle (row & 7) are the same in every copy: the global
    // address is a per-thread base plus i row rounds plus the stage's k, the shared one a
    // per-thread offset plus a constant, and which rows lie inside M is known before the loop.
    constexpr int kAChunks = C::kBlockM * 8;
    constexpr int kARowsPerRound = C::kThreads / 8;
    constexpr bool kAFull = kAChunks % C::kThreads == 0;  // else one partial round (kACopies 1)
    constexpr int kACopies = (kAChunks + C::kThreads - 1) / C::kThreads;
    static_assert(kARowsPerRound % 8 == 0 && (kAFull || kACopies == 1),
                  "activation copies are whole rounds of 8-row swizzle periods");
    const int a_chunk = tid % 8, a_row0 = tid / 8;
    const bool a_tid_valid = kAFull || tid < kAChunks;
    const T* const a_thread = a + (m0 + a_row0) * p.lda + a_chunk * 8;
    const int64_t a_round_stride = static_cast<int64_t>(kARowsPerRound) * p.lda;
    const int a_smem =
        (a_row0 * kBlockK + (a_chunk ^ (a_row0 & 7)) * 8) * static_cast<int>(sizeof(T));
    uint32_t a_row_valid = 0;
#pragma unroll
    for (int i = 0; i < kACopies; ++i) {
      if (m0 + a_row0 + i * kARowsPerRound < p.m) a_row_valid |= 1u << i;
    }

    // The weight copies of a stage: kKSteps k-tiles x kNWarps n-tiles of 512 bytes, contiguous per
    // k-tile in global memory, as 16-byte chunks c = tid + i * kThreads. Since kThreads is a
    // multiple of a k-tile's kNWarps * 32 chunks, a thread's chunk within its k-tile and its n-tile
    // are the same in every stage, and its k-tiles are kk0, kk0 + kBRows, ...: the address is a
    // per-thread base plus a per-stage offset, with no division or 64-bit multiply per copy.
    constexpr int kBRows = C::kThreads / (kNWarps * 32);  // k-tiles one round of threads copies
    static_assert(C::kThreads % (kNWarps * 32) == 0 && kKSteps % kBRows == 0,
                  "a stage's weight chunks are whole rounds of the block's threads");
    constexpr int kBCopies = kKSteps / kBRows;  // weight chunks a thread copies per stage
    const int b_kk0 = tid / (kNWarps * 32);
    const int b_rem = tid % (kNWarps * 32);
    const bool b_col_valid = static_cast<int64_t>(col_block) * kNWarps + b_rem / 32 < n_tiles_total;
    const int32_t* const b_thread =
        p.b + b_kk0 * 2 * p.n + static_cast<int64_t>(col_block) * kNWarps * kTileWords + b_rem * 4;
    const int64_t b_tile_stride = 2 * p.n;  // int32 words from one k-tile to the next

    // The copy sources of the next slice to load: load_stage is called for the slices
    // stage_begin, stage_begin + 1, ... in order and walks them on by one slice, so that a stage
    // adds a constant to two pointers instead of recomputing the 64-bit addresses.
    const T* a_src = a_thread + stage_begin * kBlockK;
    const int32_t* b_src = b_thread + static_cast<int64_t>(stage_begin) * kKSteps * b_tile_stride;

    // Issues the copies of k slice `stage` (the next in order) into the pipeline slot at byte
    // offset `slot_off`.
    auto load_stage = [&](int stage, int slot_off) {
      unsigned char* base = smem + slot_off;
      const int k_base = stage * kBlockK;
      // A: kBlockM rows x 8 chunks of 8 elements (the per-thread layout above). Rows past M are
      // not needed by any stored output (mma rows are independent), so they are skipped; columns
      // past K must read as zero.
      const bool a_k_valid = k_base + a_chunk * 8 < k_total;
#pragma unroll
      for (int i = 0; i < kACopies; ++i) {
        if (a_tid_valid) {
          if (a_row_valid & (1u << i)) {
            cp_async16(base + a_smem + i * kARowsPerRound * kBlockK * static_cast<int>(sizeof(T)),
                       a_k_valid ? a_src + i * a_round_stride : a, a_k_valid);
          }
        }
      }
      a_src += kBlockK;
      // B (the per-thread layout above): one pointer walked by a k-tile round per copy. Only a
      // stage past the last k-tile (K not a multiple of kBlockK) has rows past K, and only a
      // tile past N (never stored) has invalid columns: their copies are skipped, not
      // zero-filled. Whatever a skipped chunk's shared memory holds dequantizes to finite
      // values (any nibble is a code), which meet zero activations (k past K) or feed columns
      // that are not stored.
      unsigned char* sb = base + C::kABytes;
      const int32_t* src = b_src;
      b_src += kKSteps * b_tile_stride;
      const int b_rows_left = b_col_valid ? k_tiles_total - stage * kKSteps - b_kk0 : 0;
#pragma unroll
      for (int i = 0; i < kBCopies; ++i) {
        if (i * kBRows < b_rows_left) {
          cp_async16_full(sb + (tid + i * C::kThreads) * 16, src);
        }
        src += kBRows * b_tile_stride;
      }
      if constexpr (kGrouped) {
        const int r0 = static_cast<int>(group_div.div(k_base));
        const int r1 = r0 + 1 < num_groups ? r0 + 1 : num_groups - 1;
        // Row 1 only where the slice runs into the next group (compute_stage's boundary <
        // kKSteps, the same test): at group 64 and wider no slice does, and its copy (half the
        // scale traffic of a stage) would only be read by nobody.
        const bool second_row = k_base + kBlockK > (r0 + 1) * group_size;
        T* ss = reinterpret_cast<T*>(base + C::kABytes + C::kBBytes);
        for_chunks<2 * C::kBlockN / 8, C::kThreads>(tid, [&](int c) {
          const int r = c / (C::kBlockN / 8), col = (c % (C::kBlockN / 8)) * 8;
          if (r != 0 && !second_row) return;
          const int64_t row = r == 0 ? r0 : r1;
          const bool valid = n0 + col < p.n;
          cp_async16(ss + r * C::kBlockN + col, valid ? scales + row * p.n + n0 + col : scales,
                     valid);
        });
        if constexpr (C::kZeros) {
          int32_t* sz = reinterpret_cast<int32_t*>(base + C::kABytes + C::kBBytes + C::kSBytes);
          constexpr int kWordsPerRow = C::kBlockN / 8;
          for_chunks<2 * kWordsPerRow / 4, C::kThreads>(tid, [&](int c) {
            const int r = c / (kWordsPerRow / 4), word = (c % (kWordsPerRow / 4)) * 4;
            if (r != 0 && !second_row) return;
            const int64_t row = r == 0 ? r0 : r1;
            const bool valid = n0 + word * 8 < p.n;
            cp_async16(sz + r * kWordsPerRow + word,
                       valid ? p.zeros + row * (p.n / 8) + n0 / 8 + word : p.zeros, valid);
          });
        }
      }
    };

    // Per-column dequantization constants of the warp's 8 n8 sub-tiles (sub-tile j: column
    // 8j + g of the warp's 64). The scales as pairs, spair[i] = {s(2i), s(2i + 1)}: the
    // dequantization multiplies by spair's low or high lane broadcast (Traits lows / highs),
    // which the HMUL2's operand selects, so 4 registers hold the 8 scales and the grouped
    // kernels load them with one ldmatrix. zsub[j], the pair that removes the magic and the
    // zero point from sub-tile j's codes: {magic + zero, same} (magic + code - zsub[j] = code -
    // zero exactly), but for fp16's odd sub-tiles, whose codes are dequantized from bits 4..7
    // (Traits kHighNibbleFma), {-(64 + zero), same}.
    auto zero_pair = [](int j, uint32_t zero) {
      return Tr::kHighNibbleFma && (j & 1) != 0 ? zero * 0x100010u + Tr::kHighBias
                                                : zero * 0x10001u + Tr::kMagic;
    };
    // A wgmma warp dequantizes only words word0 and word0 + 1 of its lane's vector (sub-tiles
    // 2 word0 .. 2 word0 + 3): its constants are those of these kWords words, and spair[i] /
    // zsub[j] below count from word0 / sub-tile 2 word0.
    constexpr int kWords = kWgmma ? 2 : 4;
    const int word0 = kWgmma ? 2 * warp_m : 0;
    T2 spair[kWords];
    uint32_t zsub[2 * kWords];
#pragma unroll
    for (int j = 0; j < 2 * kWords; ++j) zsub[j] = zero_pair(j, 8);  // uint4b8: zero 8
    // The zero points of the warp's columns: nibble g of the 8 words at zrow (plain order,
    // word j holds the columns 8j..8j+7 of the warp's 64); an integer multiply-add sets both
    // lanes' mantissa bits (zero_pair).
    auto set_zeros = [&](const int32_t* zrow) {
#pragma unroll
      for (int j = 0; j < 2 * kWords; ++j) {
        zsub[j] = zero_pair(j, (static_cast<uint32_t>(zrow[2 * word0 + j]) >> (4 * g)) & 0xfu);
      }
    };
    // Lane l's row of the 8 x 8 matrix of the warp's scales (row j: sub-tile j's 8 columns, 16
    // bytes) for ldmatrix_x4_trans (x2 for a wgmma warp's 2 words): matrix i gives lane (g, t)
    // rows 2t and 2t + 1 of column g, so with row 2 (word0 + i) + (r & 1) at its rows r,
    // register i is {s(2i), s(2i + 1)} of column g, counted from sub-tile 2 word0.
    const int s_lane = warp_n * kTileN + (2 * (word0 + (lane / 8) % kWords) + (lane & 1)) * 8;

    if constexpr (!kGrouped) {
      // One group per channel: the constants never change; read them once from global memory.
      const int64_t col = n0 + warp_n * kTileN;
      if (col < p.n) {
        const T* srow = scales + col + g;
#pragma unroll
        for (int i = 0; i < kWords; ++i) {
          spair[i] = T2{srow[16 * (word0 + i)], srow[16 * (word0 + i) + 8]};
        }
        if constexpr (C::kZeros) set_zeros(p.zeros + col / 8);
      } else {
        // Columns past N: never stored; zero scales keep them finite.
#pragma unroll
        for (int i = 0; i < kWords; ++i) spair[i] = as_t2<T2>(0u);
      }
    }

    // The 16-row decode block (kTransposed) computes the transposed product, out^T = W^T a^T, at
    // any row count (see compute_stage), so that a lane's accumulators belong to the columns
    // whose scales it holds (spair): it multiplies the fp32 sums by the scales once a stage
    // instead of every dequantized weight by its scale in T (64 HMUL2 a stage).
    constexpr bool kTransposed = C::kBlockM == 16 && kKWarps == 1;

    // Word word0 + w of a lane's weight vector (sub-tiles 2w and 2w + 1 of its words) as
    // the four registers b[j] (nibble pairs (j, j + 4) for j = 0..3: b01 of sub-tile 2w, b01 of
    // 2w+1, b23 of 2w, b23 of 2w+1; marlin.h), dequantized (code - zero, exact in T) and, but
    // for the transposed product (scaled on its sums), scaled. bf16: each pair shifted to bits
    // 0..3 and 16..19, ORed into the magic's mantissa, minus magic + zero. fp16: only pairs 2
    // and 3 are shifted (by 8); pairs 1 and 3 are taken in bits 4..7 and 20..23 and scaled down
    // by the HFMA2 that removes the bias (Traits kHighNibbleFma).
    auto dequant_word = [&](int w, uint32_t word, uint32_t (&b)[4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int tile = 2 * w + (j & 1);
        T2 v;
        if constexpr (Tr::kHighNibbleFma) {
          const uint32_t src = j < 2 ? word : word >> 8;
          if (j & 1) {
            v = __hfma2(as_t2<T2>(lop3_and_or(src, 0x00f000f0u, Tr::kMagic)),
                        as_t2<T2>(Tr::kSixteenth), as_t2<T2>(zsub[tile]));
          } else {
            v = __hsub2(as_t2<T2>(lop3_and_or(src, 0x000f000fu, Tr::kMagic)),
                        as_t2<T2>(zsub[tile]));
          }
        } else {
          v = __hsub2(as_t2<T2>(lop3_and_or(word >> (4 * j), 0x000f000fu, Tr::kMagic)),
                      as_t2<T2>(zsub[tile]));
        }
        if constexpr (kTransposed) {
          b[j] = as_u32(v);
        } else {
          const T2 s = (j & 1) ? Tr::highs(spair[w]) : Tr::lows(spair[w]);
          b[j] = as_u32(__hmul2(v, s));
        }
      }
    };

    // wgmma blocks: acc, as kBlockM floats, is the accumulators of warpgroup warp_m's two
    // products (word 2 warp_m + h at &acc[0][0][0] + h * kBlockM / 2; wgmma.cuh gives their
    // layout).
    float acc[kMTiles][8][4];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // The decode block's transposed product, out^T = W^T a^T: the dequantized weights of
    // sub-tiles 2w and 2w + 1 are, in the order they are computed (b[0..3]), the A fragment of
    // the 16 x 16 tile W^T (rows = those 16 columns, a0 / a1 = k 2t.. of columns g / g + 8,
    // a2 / a3 = k 2t + 8..), and rows 8h..8h + 7 of the activations (k 2t.. and 2t + 8..) are
    // the B fragment of a^T. One m16n8k16 covers 16 columns x 8 rows: acc[0][4h + w] holds
    // column 16w + g (+ 8 for elements 2, 3) x rows 8h + 2t, 8h + 2t + 1 until the shuffles
    // after the main loop put it back. Narrow row blocks (at most 8 rows inside M: decode at
    // M <= 8) compute only h = 0, half the MMAs of the 16-row tile (rows 8..15 of the
    // activations are neither read nor stored).
    const bool narrow = kTransposed && p.m - m0 <= 8;

    // The slice's k steps fall in at most two groups (group_size >= 32, a multiple of 16): row
    // 0 of the slice's scales up to k step `boundary` (>= 1), row 1 from there on (when
    // boundary < kKSteps), found from the first step's offset in its group (one FastDiv per
    // slice). A warp loads its first step's row, and reloads only at the boundary.
    auto group_boundary = [&](int stage) {
      return kGrouped
                 ? group_tiles - (stage * kKSteps -
                                  static_cast<int>(group_div.div(stage * kBlockK)) * group_tiles)
                 : kKSteps;
    };
    // Scale (and zero) row r of the slice in the pipeline slot at `base`.
    auto load_group = [&](const unsigned char* base, int r) {
      const T* ss = reinterpret_cast<const T*>(base + C::kABytes + C::kBBytes);
      uint32_t sp[4];
      if constexpr (kWords == 4) {
        ldmatrix_x4_trans(sp, ss + r * C::kBlockN + s_lane);
      } else {
        ldmatrix_x2_trans(sp[0], sp[1], ss + r * C::kBlockN + s_lane);
      }
#pragma unroll
      for (int q = 0; q < kWords; ++q) spair[q] = as_t2<T2>(sp[q]);
      if constexpr (C::kZeros) {
        const int32_t* sz =
            reinterpret_cast<const int32_t*>(base + C::kABytes + C::kBBytes + C::kSBytes);
        set_zeros(sz + r * (C::kBlockN / 8) + warp_n * (kTileN / 8));
      }
    };

    auto compute_stage = [&](int slot_off, int stage, auto narrow_tag) {
      constexpr bool kNarrow = decltype(narrow_tag)::value;
      const unsigned char* base = smem + slot_off;
      const T* sa = reinterpret_cast<const T*>(base);
      const int4* sb = reinterpret_cast<const int4*>(base + C::kABytes);
      const int boundary = group_boundary(stage);
      // Register double buffer of the A fragments and the packed weight vector per k step.
      uint32_t af[2][kMTiles][4];
      int4 bq[2];
      // The transposed product's B operands are consecutive register pairs: rows 8h..8h + 7 at k
      // 2t.. and 2t + 8.. (matrices 2h and 2h + 1 of the x4; narrow: only rows 0..7, an x2,
      // whose lanes 0..15 give the row addresses).
      auto fetch = [&](int kk, uint32_t (&a_frag)[kMTiles][4], int4& b_vec) {
        if constexpr (kNarrow) {
          const int row = lane % 8, chunk = kk * 2 + (lane / 8) % 2;
          ldmatrix_x2(a_frag[0][0], a_frag[0][1], sa + row * kBlockK + ((chunk ^ row) * 8));
        } else if constexpr (kTransposed) {
          const int mat = lane / 8;
          const int row = (lane % 8) + 8 * (mat >> 1), chunk = kk * 2 + (mat & 1);
          ldmatrix_x4(a_frag[0], sa + row * kBlockK + ((chunk ^ (row & 7)) * 8));
        } else {
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            const int mat = lane / 8;
            const int row = (warp_m * kMTiles + mi) * 16 + (lane % 8) + 8 * (mat & 1);
            const int chunk = kk * 2 + (mat >> 1);
            ldmatrix_x4(a_frag[mi], sa + row * kBlockK + ((chunk ^ (row & 7)) * 8));
          }
        }
        b_vec = sb[(kk * kNWarps + warp_n) * 32 + lane];
      };
      // Transposed, grouped: the stage's unscaled sums of each group, added to acc times the
      // group's scales (fold) where the group ends in the stage and at its end.
      constexpr int kHalves = kNarrow ? 1 : 2;  // row halves of the transposed product
      float gacc[kTransposed && kGrouped ? 8 : 1][4] = {};
      auto fold = [&]() {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 s = Tr::to_float2(spair[w]);
#pragma unroll
          for (int h = 0; h < kHalves; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              acc[0][4 * h + w][e] =
                  fmaf(e < 2 ? s.x : s.y, gacc[4 * h + w][e], acc[0][4 * h + w][e]);
              gacc[4 * h + w][e] = 0.f;
            }
        }
      };
      // This warp's k steps of the stage: kk0, kk0 + 1, ... (all of them with one k group).
      const int kk0 = warp_k * C::kWarpKSteps;
      fetch(kk0, af[0], bq[0]);
#pragma unroll
      for (int i = 0; i < C::kWarpKSteps; ++i) {
        const int kk = kk0 + i;
        if constexpr (kGrouped) {
          if (i == 0) {
            load_group(base, kk >= boundary ? 1 : 0);
          } else if (kk == boundary) {  // uniform over the block
            if constexpr (kTransposed) fold();
            load_group(base, 1);
          }
        }
        // This step's fragments were fetched during the previous step; fetch the next step's now,
        // so their shared-memory latency hides behind this step's dequantization and MMAs.
        if (i + 1 < C::kWarpKSteps) fetch(kk + 1, af[(i + 1) % 2], bq[(i + 1) % 2]);
        const int4 packed = bq[i % 2];
        const uint32_t words[4] = {static_cast<uint32_t>(packed.x), static_cast<uint32_t>(packed.y),
                                   static_cast<uint32_t>(packed.z),
                                   static_cast<uint32_t>(packed.w)};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t b[4];
          dequant_word(w, words[w], b);
          if constexpr (kTransposed) {
#pragma unroll
            for (int h = 0; h < kHalves; ++h) {
              float (&d)[4] = kTransposed && kGrouped ? gacc[4 * h + w] : acc[0][4 * h + w];
              mma_16816<T>(d, b, af[i % 2][0][2 * h], af[i % 2][0][2 * h + 1]);
            }
          } else {
#pragma unroll
            for (int mi = 0; mi < kMTiles; ++mi) {
              mma_16816<T>(acc[mi][2 * w], af[i % 2][mi], b[0], b[2]);
              mma_16816<T>(acc[mi][2 * w + 1], af[i % 2][mi], b[1], b[3]);
            }
          }
        }
      }
      if constexpr (kTransposed && kGrouped) fold();
    };

    // A wgmma block's stage, in two batches of two k steps: each warp dequantizes words
    // 2 warp_m and 2 warp_m + 1 of its lane's weight vector for a batch's steps into 4 A
    // fragments (16 of its columns each: wgmma.cuh's register A, rows g / g + 8 = sub-tiles
    // 2w / 2w + 1), then its warpgroup issues the batch's 4 m64 n(kBlockM) k16 products against
    // the stage's activations (B, read in place: the activation tile's XOR swizzle is the
    // 128-byte swizzle) and waits only for the batch before. So a warpgroup dequantizes a batch
    // while the tensor cores run the one before: the fragments are double-buffered (afw[batch],
    // the buffer of batch 0 free again once batch 1 of the same stage has waited). The first
    // batch's wait also sees every product of the stage before done: first_batch_done() then
    // frees that stage's slot for the producer.
    constexpr int kBatchSteps = 2;
    uint32_t afw[kWgmma ? kKSteps / kBatchSteps : 1][kBatchSteps][2][4];
    auto compute_stage_wgmma = [&](int slot_off, int stage, auto&& first_batch_done) {
      if constexpr (kWgmma) {
        const unsigned char* base = smem + slot_off;
        const int2* sb = reinterpret_cast<const int2*>(base + C::kABytes);
        const int boundary = group_boundary(stage);
        auto fetch = [&](int kk) { return sb[((kk * kNWarps + warp_n) * 32 + lane) * 2 + warp_m]; };
        const uint64_t desc = wgmma::desc_k_sw128(smem_addr(base));
        int2 next = fetch(0);  // the packed weights of a step, fetched one step ahead
#pragma unroll
        for (int b = 0; b < kKSteps / kBatchSteps; ++b) {
#pragma unroll
          for (int i = 0; i < kBatchSteps; ++i) {
            const int kk = b * kBatchSteps + i;
            if constexpr (kGrouped) {
              if (kk == 0) {
                load_group(base, 0);        // boundary >= 1
              } else if (kk == boundary) {  // uniform over the block
                load_group(base, 1);
              }
            }
            const int2 packed = next;
            if (kk + 1 < kKSteps) next = fetch(kk + 1);
            dequant_word(0, static_cast<uint32_t>(packed.x), afw[b][i][0]);
            dequant_word(1, static_cast<uint32_t>(packed.y), afw[b][i][1]);
          }
          wgmma::fence();
#pragma unroll
          for (int i = 0; i < kBatchSteps; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              wgmma::WgmmaRs<T, C::kBlockM>::mma(&acc[0][0][0] + h * (C::kBlockM / 2), afw[b][i][h],
                                                 desc + 2 * (b * kBatchSteps + i), 1);
            }
          wgmma::commit();
          wgmma::wait<1>();  // the batch before is done: its fragments (and slot) are free
          if (b == 0) first_batch_done();  // every product of the stage before is done
        }
      }
    };

    if constexpr (kWgmma) {
      // A consumer waits for its stage's bytes (full), computes it, and frees the slot of the
      // stage before once the stage's first batch has waited (compute_stage_wgmma's
      // first_batch_done); the segment's last slot after the loop. No block barrier a stage.
      int prev = -1;
      for (int it = 0; it < n_iters; ++it) {
        tma::wait(full_bars + pipe.slot, pipe.parity);
        compute_stage_wgmma(pipe.slot * C::kStageBytes, stage_begin + it, [&] {
          if (prev >= 0) {
            __syncwarp();
            if (lane == 0) tma::arrive(empty_bars + prev);
          }
        });
        prev = pipe.slot;
        pipe.advance();
      }
    } else {
      // The pipeline of the mma.sync blocks: every thread copies its chunks of a stage
      // (load_stage), kAhead = kStages - 1 slices in flight while one is computed; or, in the
      // TMA-fed decode block, the producer warp fills the slots (produce_segments).
      constexpr int kAhead = C::kStages - 1;
      if constexpr (!C::kProducer) {
#pragma unroll
        for (int s = 0; s < kAhead; ++s) {
          if (s < n_iters) load_stage(stage_begin + s, s * C::kStageBytes);
          cp_async_commit();
        }
      }
      // Slice `it` is in slot it % kStages and slice it + kAhead goes to slot (it + kAhead) %
      // kStages: byte offsets kept as counters instead of a division per stage.
      auto main_loop = [&](auto narrow_tag) {
        if constexpr (C::kProducer) {
          // A consumer warp waits for its stage's bytes (full), computes it, and frees the slot
          // (empty): its reads of the slot are done once compute_stage has used them. No block
          // barrier a stage.
          for (int it = 0; it < n_iters; ++it) {
            tma::wait(full_bars + pipe.slot, pipe.parity);
            compute_stage(pipe.slot * C::kStageBytes, stage_begin + it, narrow_tag);
            __syncwarp();
            if (lane == 0) tma::arrive(empty_bars + pipe.slot);
            pipe.advance();
          }
        } else {
          int compute_off = 0, load_off = kAhead * C::kStageBytes;
          for (int it = 0; it < n_iters; ++it) {
            cp_async_wait<kAhead - 1>();
            // Slice `it` is visible to all, and every warp is done with slot (it + kAhead) %
            // kStages (read by slice it - 1).
            __syncthreads();
            if (it + kAhead < n_iters) load_stage(stage_begin + it + kAhead, load_off);
            cp_async_commit();
            load_off += C::kStageBytes;
            if (load_off == C::kStages * C::kStageBytes) load_off = 0;
            compute_stage(compute_off, stage_begin + it, narrow_tag);
            compute_off += C::kStageBytes;
            if (compute_off == C::kStages * C::kStageBytes) compute_off = 0;
          }
        }
      };
      if constexpr (kTransposed) {
        if (narrow) {
          main_loop(std::true_type{});
        } else {
          main_loop(std::false_type{});
        }
        if constexpr (!kGrouped) {  // one scale per column: applied to the sums once
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 s = Tr::to_float2(spair[w]);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[0][4 * h + w][e] *= e < 2 ? s.x : s.y;
          }
        }
        // Back to the 16-row layout the epilogue uses (a narrow block's rows 8..15 stay zero):
        // row 8h + g, column 8j + 2t + e sits in lane 4 (2t + e) + g / 2, element 2 (j & 1) +
        // (g & 1) of acc[0][4h + j / 2].
        float tr[8][4];
#pragma unroll
        for (int w = 0; w < 8; ++w)
#pragma unroll
          for (int e = 0; e < 4; ++e) tr[w][e] = acc[0][w][e];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int src = 4 * (2 * t + e) + g / 2;
              float x[4];
#pragma unroll
              for (int q = 0; q < 4; ++q) x[q] = __shfl_sync(0xffffffffu, tr[4 * h + w][q], src);
              acc[0][2 * w][2 * h + e] = (g & 1) ? x[1] : x[0];
              acc[0][2 * w + 1][2 * h + e] = (g & 1) ? x[3] : x[2];
            }
      } else {
        main_loop(std::false_type{});
      }
      if constexpr (!C::kProducer) cp_async_wait<0>();
    }

    if constexpr (kWgmma) {
      // The accumulators, written behind the compiler's back, are final once the last stage's
      // products are. Lane (g, t) holds, for word h and 8-row group j, columns g (sub-tiles
      // 2w and 2w + 1, w = 2 warp_m + h) x rows 8j + 2t, 8j + 2t + 1; one exchange with lane
      // g ^ 1 makes each element pair two adjacent columns of one row, the pairs the epilogue
      // stores: lane g even keeps row 8j + 2t, columns g, g + 1; g odd row 8j + 2t + 1, columns
      // g - 1, g.
      wgmma::wait<0>();
      if (n_iters > 0) {  // the segment's last slot is free
        __syncwarp();
        if (lane == 0) tma::arrive(empty_bars + (pipe.slot + C::kStages - 1) % C::kStages);
      }
      float* accf = &acc[0][0][0];
#pragma unroll
      for (int i = 0; i < C::kBlockM; ++i) wgmma::fence_operand(accf[i]);
#pragma unroll
      for (int i = 0; i < C::kBlockM; i += 2) {
        const float give = (g & 1) ? accf[i] : accf[i + 1];
        const float got = __shfl_xor_sync(0xffffffffu, give, 4);
        if (g & 1) {
          accf[i] = got;
        } else {
          accf[i + 1] = got;
        }
      }
    }

    if constexpr (kKWarps > 1) {
      // In-block reduction over the k groups, in group order (deterministic): group r > 0 stores
      // its accumulators (16-byte vectors, lane fastest: conflict-free) into the pipeline's
      // buffers, which every warp is done with after the barrier, and group 0 adds them.
      float4* red = reinterpret_cast<float4*>(smem) + warp_mn * (kMTiles * 8 * 32) + lane;
#pragma unroll 1
      for (int r = 1; r < kKWarps; ++r) {
        __syncthreads();
        if (warp_k == r) {
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              red[(mi * 8 + j) * 32] =
                  make_float4(acc[mi][j][0], acc[mi][j][1], acc[mi][j][2], acc[mi][j][3]);
        }
        __syncthreads();
        if (warp_k == 0) {
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float4 v = red[(mi * 8 + j) * 32];
              acc[mi][j][0] += v.x;
              acc[mi][j][1] += v.y;
              acc[mi][j][2] += v.z;
              acc[mi][j][3] += v.w;
            }
        }
      }
    }

    // Epilogue. Accumulator element e of (mi, j): row g + 8 * (e / 2), column 2t + e % 2.
    T* out = static_cast<T*>(p.out);
    const T* bias = static_cast<const T*>(p.bias);
    auto store = [&](int64_t row, int64_t col, float v0, float v1) {
      if (bias != nullptr) {
        v0 += Tr::to_float(bias[col]);
        v1 += Tr::to_float(bias[col + 1]);
      }
      *reinterpret_cast<T2*>(out + row * p.ldc + col) = Tr::float2_to(v0, v1);
    };
    // A wgmma thread's accumulators after the exchange above, as float4s: float4 i (word h =
    // i / (kBlockM / 8) of the warpgroup, 8-row group j = i % (kBlockM / 8)) is two pairs, of
    // one row and columns s = 0, 1. fn(row, col, v0, v1) for those of quad v = floats 4i..4i+3
    // that lie inside M (the columns are the caller's to bound).
    auto wgmma_quad_pairs = [&](int i, const float* v, auto&& fn) {
      const int h = i / (C::kBlockM / 8), j = i % (C::kBlockM / 8);
      const int64_t row = m0 + 8 * j + 2 * t + (g & 1);
      if (row >= p.m) return;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int64_t col = n0 + warp_n * kTileN + 8 * (4 * warp_m + 2 * h + s) + (g & ~1);
        fn(row, col, v[2 * s], v[2 * s + 1]);
      }
    };
    // fn(row, col, v0, v1) for the in-bounds accumulator pairs (v0, v1: the elements of acc) of
    // k group 0 (which holds the block's sums; the other groups' warps only wait at barriers).
    // N is a multiple of kTileN (the binding checks): a warp's 64 columns are all inside N or
    // all past it, so one test per warp (not one per pair) bounds the columns.
    const bool warp_cols_in = n0 + warp_n * kTileN < p.n;
    auto for_each_pair = [&](auto&& fn) {
      if (kKWarps > 1 && warp_k != 0) return;
      if (!warp_cols_in) return;
      if constexpr (kWgmma) {
        const float* accf = &acc[0][0][0];
#pragma unroll
        for (int i = 0; i < C::kBlockM / 4; ++i) wgmma_quad_pairs(i, accf + 4 * i, fn);
      } else {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t row = m0 + (warp_m * kMTiles + mi) * 16 + g + 8 * h;
            if (row >= p.m) continue;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const int64_t col = n0 + warp_n * kTileN + 8 * j + 2 * t;
              fn(row, col, acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
            }
          }
      }
    };

    // Sums the tile's quads (4 columns of one row) first, first + step, ... over `slots` sources
    // in slot order (the result does not depend on which block sums) and stores them;
    // load(z, r, c) reads source z's quad at tile row r, column c. The loads of kBatch quads x up
    // to kSlots sources go out together: the accumulators are dead here, so their registers can
    // hold loads in flight (8 sources spilled in the taller blocks). (The global-memory path
    // summed into the accumulators slot by slot, which kept about one load in flight a thread
    // where they filled the registers. H100, 2026-11-26, f16 uint4b8, group 128, M = 128, 50
    // back-to-back calls, before / after: m64n256w split 4 37.9 / 29.1 us at 4096 x 4096 and
    // 98.2 / 77.8 at 8192 x 8192, m128n256w split 4 62.2 / 43.7 and 82.9 / 64.5;
    // kernels/marlin/NOTES.md.)
    auto sum_quads = [&](int first, int step, int slots, auto&& load) {
      constexpr int kBatch = 2, kSlots = 4;
      const int rows = static_cast<int>(p.m - m0 < C::kBlockM ? p.m - m0 : C::kBlockM);
      const int quads = rows * (C::kBlockN / 4);
      for (int q0 = first; q0 < quads; q0 += kBatch * step) {
        int r[kBatch], c[kBatch];
        bool in[kBatch];
        float4 sum[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int q = q0 + u * step;
          r[u] = q / (C::kBlockN / 4);
          c[u] = q % (C::kBlockN / 4) * 4;
          in[u] = q < quads && n0 + c[u] < p.n;  // N is a multiple of 64: all 4 in or all out
          sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int z0 = 0; z0 < slots; z0 += kSlots) {
          float4 v[kBatch][kSlots];
#pragma unroll
          for (int u = 0; u < kBatch; ++u)
#pragma unroll
            for (int z = 0; z < kSlots; ++z)
              if (in[u] && z0 + z < slots) v[u][z] = load(z0 + z, r[u], c[u]);
#pragma unroll
          for (int u = 0; u < kBatch; ++u)
#pragma unroll
            for (int z = 0; z < kSlots; ++z) {
              if (in[u] && z0 + z < slots) {
                sum[u].x += v[u][z].x;
                sum[u].y += v[u][z].y;
                sum[u].z += v[u][z].z;
                sum[u].w += v[u][z].w;
              }
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (!in[u]) continue;
          store(m0 + r[u], n0 + c[u], sum[u].x, sum[u].y);
          store(m0 + r[u], n0 + c[u] + 2, sum[u].z, sum[u].w);
        }
      }
    };

    // Read again after the main loop rather than kept in registers through it.
    const int contributors = seg.contributors;
    if (contributors == 1) {
      for_each_pair(store);
      continue;
    }
    // Split-K in a cluster (launch_gemm_instance launches the `splits` blocks of a tile as one
    // cluster on sm_90, where each block has exactly this one segment): every block puts its
    // tile of fp32 sums in its own shared memory, and after a cluster barrier block `rank` sums
    // a 1/`blocks` share of the tile over the blocks' shared memory, in rank (= slot) order as
    // the global-memory path below sums its slots, and stores it. No global round trips: the
    // fp32 partials, the fence, the counter and the last block's serial read of every slot (an
    // H100 probe: 10 of 60 us at M = 16, 28672 x 8192, split 8) are gone.
    if constexpr (C::kClusterReduce) {
      const uint2 cluster = cluster_blocks_rank();
      const uint32_t blocks = cluster.x;
      if (blocks > 1) {
        // The tile, tile-local, in rows of C::kTileSumStride floats.
        float* const red = reinterpret_cast<float*>(smem);
        auto red_at = [&](int r, int c) { return red + r * C::kTileSumStride + c; };
        sync_consumers();  // every warp is done with the pipeline's buffers
        for_each_pair([&](int64_t row, int64_t col, float v0, float v1) {
          *reinterpret_cast<float2*>(
              red_at(static_cast<int>(row - m0), static_cast<int>(col - n0))) = make_float2(v0, v1);
        });
        cluster_sync();
        sum_quads(static_cast<int>(cluster.y) * C::kThreads + tid,
                  static_cast<int>(blocks) * C::kThreads, static_cast<int>(blocks),
                  [&](int z, int r, int c) { return ld_cluster_f4(smem_addr(red_at(r, c)), z); });
        cluster_sync();  // no block leaves while another still reads its shared memory
        continue;
      }
    }
    // The 64-row wgmma block's slot, where the last block to arrive sums the tile, is its
    // accumulators in their own order: float4 i of thread tid at frag_slot(z) + i * kThreads
    // (GemmPlan::partial_floats sizes the slots by whole tiles), so that each warp stores and
    // loads 512 contiguous bytes, and the last block adds the other slots to its accumulators
    // in registers. In the tile's [M, N] order (which the spread sum keeps, where every block
    // sums a share of the tile) a block took ~6 us to store its slot and the last one ~15 us to
    // sum two (H200, stream-K at M = 64, 8192 x 28672; kernels/marlin/NOTES.md). The 128-row
    // block keeps the [M, N] order: with the float4 stores ptxas rescheduled its main loop (200
    // -> 207 instructions, a spill more in it).
    // (seg.slot is read where it is used: held in a register from here, it made ptxas spill in
    // the 128-row wgmma block's main loop.)
    constexpr int kFragVecs = C::kBlockM / 4;  // a wgmma thread's accumulators as float4s
    auto frag_slot = [&](int z) {
      const int64_t tile = static_cast<int64_t>(z) * gridDim.y + blockIdx.y;
      return reinterpret_cast<float4*>(p.partials) +
             (tile * ((p.n + C::kBlockN - 1) / C::kBlockN) + seg.col_block) * kFragVecs *
                 C::kThreads +
             tid;
    };
    if (C::kFragSlots && !spread) {
      const float* accf = &acc[0][0][0];
      float4* const mine = frag_slot(seg.slot);
#pragma unroll
      for (int i = 0; i < kFragVecs; ++i) {
        mine[i * C::kThreads] =
            make_float4(accf[4 * i], accf[4 * i + 1], accf[4 * i + 2], accf[4 * i + 3]);
      }
    } else {
      for_each_pair([&](int64_t row, int64_t col, float v0, float v1) {
        *reinterpret_cast<float2*>(p.partials + (seg.slot * p.m + row) * p.n + col) =
            make_float2(v0, v1);
      });
    }
    sync_consumers();  // every thread's slot is stored before thread 0 releases it below
    auto load_slot = [&](int z, int r, int c) {
      return __ldcg(reinterpret_cast<const float4*>(
          p.partials + (static_cast<int64_t>(z) * p.m + m0 + r) * p.n + n0 + c));
    };
    int* const counter = p.counters +
                         static_cast<int64_t>(blockIdx.y) * ((p.n + C::kBlockN - 1) / C::kBlockN) +
                         seg.col_block;
    // Thread 0 raises the tile's counter by the launch's arrival step (releasing the block's
    // slot, acquiring the slots of the blocks before it). Every launch leaves the counters at
    // zero, so before this block's arrival the counter holds j steps of this launch, j <
    // `contributors` (kArrivalCountBits): any other value was there at launch (a workspace shared
    // by launches that run at the same time, or one stopped midway, or never zeroed), and fails
    // the launch (fail_launch), where the last-block sum would sum the tile wrongly (an early
    // block taking itself for the last) and the spread sum wait for ever. That holds for every
    // count left below 2^kArrivalCountBits (no multiple of an odd tag is zero in the tag's bits),
    // for j blocks' counts left by a launch of this process d launches before unless j * d is a
    // multiple of 2^19, and for all but fewer than one in 2^20 other values. A value that does
    // read as this launch's (j < `contributors` steps of its own tag: a captured graph's replay
    // stopped midway, or the exceptions above) passes the last-block sum's check; the spread sum
    // catches every value but zero (its blocks then count past `contributors`). `polls` then
    // starts at the spread wait's bound, so that one check at the end fails both (a fail_launch
    // in the wait too made ptxas schedule the 32-row block's main loop differently, and M = 32
    // 8192 x 28672 ran 1.6% slower on an H200).
    constexpr int kMaxPolls = 1 << 22;
    __shared__ int last_to_arrive;
    if (tid == 0) {
      const uint32_t step = p.arrival_step;
      const uint32_t before = static_cast<uint32_t>(atom_add_acq_rel_gpu(counter, step));
      const uint32_t arrived = before & kArrivalCountMask;
      const uint32_t sharers = static_cast<uint32_t>(contributors);
      int polls = before != arrived * step || arrived >= sharers ? kMaxPolls : 0;
      if (spread) {
        // Split-K with every block of the grid resident at once (launch_gemm_instance launched
        // it cooperatively; each block has this one segment): wait until every block of the
        // tile has stored its slot (the count reaches `contributors`), then count the blocks
        // past that wait a second time; the last of them resets the counter for the next
        // launch. The wait is bounded (a poll is an L2 round trip and a sleep of up to 0.2 us:
        // kMaxPolls of them take about a second or more, where the tile's blocks, all resident,
        // arrive within microseconds of each other), so that a counter another launch reset
        // under this one fails the launch instead of hanging it.
        while (polls < kMaxPolls &&
               (static_cast<uint32_t>(ld_acquire_gpu(counter)) & kArrivalCountMask) < sharers) {
          __nanosleep(100);
          ++polls;
        }
        if (atomicAdd(reinterpret_cast<unsigned*>(counter), step) == (2 * sharers - 1) * step) {
          *counter = 0;
        }
      } else {
        // The last to arrive sums every slot and resets the counter (all have arrived).
        last_to_arrive = before == (sharers - 1) * step;
        if (last_to_arrive) *counter = 0;
      }
      if (polls >= kMaxPolls) fail_launch();
    }
    sync_consumers();
    if (C::kFragSlots && !spread) {
      if (!last_to_arrive) continue;
      // The sum in slot order from zero, as sum_quads takes it (the same bits whichever way a
      // tile is summed): the slots before this block's own into a prefix, which its
      // accumulators then join (x + y == y + x), and the slots after it added on; kBatch
      // float4s of loads in flight together: with two slots one round of loads a batch (reading
      // its own slot back too took two).
      constexpr int kBatch = 8;
      float* accf = &acc[0][0][0];
      const int own = seg.slot;
#pragma unroll
      for (int i0 = 0; i0 < kFragVecs; i0 += kBatch) {
        float4 prefix[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) prefix[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        auto add_slot = [&](int z, float4(&into)[kBatch]) {
          const float4* src = frag_slot(z) + i0 * C::kThreads;
          float4 v[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) v[u] = __ldcg(src + u * C::kThreads);
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            into[u].x += v[u].x;
            into[u].y += v[u].y;
            into[u].z += v[u].z;
            into[u].w += v[u].w;
          }
        };
#pragma unroll 1
        for (int z = 0; z < own; ++z) add_slot(z, prefix);
        float4 sum[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float* a4 = accf + 4 * (i0 + u);
          sum[u] = make_float4(prefix[u].x + a4[0], prefix[u].y + a4[1], prefix[u].z + a4[2],
                               prefix[u].w + a4[3]);
        }
#pragma unroll 1
        for (int z = own + 1; z < contributors; ++z) add_slot(z, sum);
        if (warp_cols_in) {
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const float q[4] = {sum[u].x, sum[u].y, sum[u].z, sum[u].w};
            wgmma_quad_pairs(i0 + u, q, store);
          }
        }
      }
      continue;
    }
    int first = tid, step = C::kThreads;
    if (spread) {
      // As in a cluster, block `slot` sums a 1/contributors share of the tile over every slot,
      // in slot order.
      first = seg.slot * C::kThreads + tid;
      step = contributors * C::kThreads;
    } else if (!last_to_arrive) {
      continue;
    }
    // The last block reads its own slot back too: the order of the sum is the slots', whichever
    // block is last.
    sum_quads(first, step, contributors, load_slot);
  }
}

/// Sets the kernel's shared-memory opt-in on the current device once (a per-device attribute;
/// a repeat from a racing thread is harmless) and returns its resident blocks per SM there
/// (queried once per device; the split heuristic needs it on every call).
template <typename T, WeightType kWeight, bool kGrouped, int kMTiles, int kMWarps, int kNWarps,
          int kKWarps, Engine kEngine>
gpuError_t configure_instance(int* blocks_per_sm) {
  using C = Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  auto kernel = gemm_kernel<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  static PerDevice occupancy;
  int device = 0;
  gpuError_t err = cudaGetDevice(&device);
  if (err != gpuSuccess) return err;
  const int blocks = occupancy.get(device, [&] {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemAlloc);
    int resident = 0;
    if (err == gpuSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, C::kBlockThreads,
                                                          C::kSmemAlloc);
    }
    return err != gpuSuccess ? 0 : resident < 1 ? 1 : resident;
  });
  if (err != gpuSuccess) return err;
  if (blocks_per_sm != nullptr) *blocks_per_sm = blocks;
  return gpuSuccess;
}

/// The attribute of a launch in clusters of `splits` blocks along x.
inline cudaLaunchAttribute cluster_attribute(int splits) {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(splits);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  return cluster;
}

/// The attribute of a cooperative launch: every block of the grid resident at once, or the
/// runtime refuses the launch.
inline cudaLaunchAttribute cooperative_attribute() {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  return cooperative;
}

/// The launch of `grid` blocks of `threads` threads, each block asking for `smem` bytes of
/// dynamic shared memory, with the `count` attributes at `attrs` (they must outlive the
/// configuration).
inline cudaLaunchConfig_t launch_config(dim3 grid, int threads, int smem, gpuStream_t stream,
                                        cudaLaunchAttribute* attrs, unsigned count = 1) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  return config;
}

/// A cluster launch of one instantiation (launch_gemm_instance): the dynamic shared memory each
/// block asks for, so that no more blocks than the grid's share share an SM, and how many
/// clusters are then resident at once (0: none run here).
struct ClusterShape {
  int smem;
  int clusters;
};

/// The ClusterShape of instantiation C (`natural` blocks to an SM) for `blocks` blocks in
/// clusters of `splits` on the current device of `sms` SMs (GemmProblem::sm_count); worked out
/// once per (device, splits, blocks to an SM) and cached.
template <typename C, typename Kernel>
ClusterShape cluster_shape(Kernel kernel, int natural, int sms, int splits, int64_t blocks) {
  constexpr int kMaxDevices = 64, kMaxPerSm = 4;
  // (smem << 32) | (clusters + 1); 0: not worked out yet.
  static std::atomic<int64_t> cache[kMaxDevices][kMaxClusterSplits + 1][kMaxPerSm + 1];
  int device = 0;
  if (sms < 1 || cudaGetDevice(&device) != gpuSuccess || device >= kMaxDevices) {
    (void)gpuGetLastError();
    return {C::kSmemAlloc, 0};
  }
  // As many blocks to an SM as its slots hold, or more: no shaping (the slots decide).
  int64_t per_sm = (blocks + sms - 1) / sms;
  if (per_sm >= natural || per_sm > kMaxPerSm) per_sm = 0;
  std::atomic<int64_t>& cached = cache[device][splits][per_sm];
  const int64_t packed = cached.load(std::memory_order_relaxed);
  if (packed != 0) {
    return {static_cast<int>(packed >> 32), static_cast<int>(packed & 0xffffffff) - 1};
  }
  ClusterShape shape{C::kSmemAlloc, 0};
  int sm_smem = 0, reserved = 0, optin = 0;
  cudaFuncAttributes attr{};
  if (per_sm > 0 &&
      cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) ==
          gpuSuccess &&
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) ==
          gpuSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          gpuSuccess &&
      cudaFuncGetAttributes(&attr, kernel) == gpuSuccess) {
    const int fixed = static_cast<int>(attr.sharedSizeBytes);
    const int limit = optin - fixed;
    int want = sm_smem / static_cast<int>(per_sm) - reserved - fixed;
    want = (want < limit ? want : limit) / 128 * 128;
    if (want > shape.smem &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit) ==
            gpuSuccess) {
      shape.smem = want;
    }
  }
  cudaLaunchAttribute cluster = cluster_attribute(splits);
  const cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(splits)),
                                                  C::kBlockThreads, shape.smem, nullptr, &cluster);
  if (cudaOccupancyMaxActiveClusters(&shape.clusters, kernel, &config) != gpuSuccess ||
      shape.clusters < 0) {
    shape.clusters = 0;
  }
  (void)gpuGetLastError();
  cached.store((static_cast<int64_t>(shape.smem) << 32) | (shape.clusters + 1),
               std::memory_order_relaxed);
  return shape;
}

/// @brief Clusters of `splits` blocks of this instantiation resident at once when
/// launch_gemm_instance runs a split-K grid of `blocks` blocks in clusters on the current device
/// of `sms` SMs (0: it would not: no room for the tile's sums, a cluster size outside
/// 2..kMaxClusterSplits, or none run here). Only meaningful on sm_90 and newer.
template <typename T, WeightType kWeight, bool kGrouped, int kMTiles, int kMWarps, int kNWarps,
          int kKWarps, Engine kEngine>
int resident_clusters(int sms, int splits, int64_t blocks) {
  using C = Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  if (!C::kClusterReduce || splits < 2 || splits > kMaxClusterSplits) return 0;
  int natural = 1;
  if (configure_instance<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>(
          &natural) != gpuSuccess) {
    return 0;
  }
  auto kernel = gemm_kernel<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  return cluster_shape<C>(kernel, natural, sms, splits, blocks).clusters;
}

/// @brief Launches one instantiation on a grid of `workers` x (row blocks): the `workers` blocks of
/// a row of blocks share its column tiles x k slices in equal contiguous ranges (gemm_kernel).
/// workers = column tiles x splits is split-K; every tile whose k range several blocks share
/// needs p.partials (max_contributors(...) slots of M x N floats, or of whole tiles for the
/// 64-row wgmma block: GemmPlan::partial_floats) and a counter (of col tiles x row blocks) in
/// p.counters. `sum`: how split tiles are summed (SplitSum; kAuto but in tests and
/// benchmarks).
template <typename T, WeightType kWeight, bool kGrouped, int kMTiles, int kMWarps, int kNWarps,
          int kKWarps, Engine kEngine>
gpuError_t launch_gemm_instance(const GemmProblem& p, int workers, SplitSum sum,
                                gpuStream_t stream) {
  using C = Config<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  auto kernel = gemm_kernel<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>;
  if (p.k <= 0 || p.k > (int64_t{1} << 30)) return cudaErrorInvalidValue;  // 32-bit k in the kernel
  if (kGrouped && (p.group_size < 32 || p.group_size % kTileK != 0)) return cudaErrorInvalidValue;
  const int64_t units = (p.n + C::kBlockN - 1) / C::kBlockN * ((p.k + kBlockK - 1) / kBlockK);
  // Every block needs a unit at least: a tile's count of contributors assumes no empty range.
  // The kernel's partition arithmetic is 32-bit (Partition).
  if (workers < 1 || workers > units || units >= (int64_t{1} << 31) ||
      static_cast<int64_t>(workers) * (units % workers) >= (int64_t{1} << 32)) {
    return cudaErrorInvalidValue;
  }
  // Each range holds units / workers units or one more: long enough that a tile's blocks stay
  // within the counters' count bits.
  if (units / workers < min_range_slices((p.k + kBlockK - 1) / kBlockK)) {
    return cudaErrorInvalidValue;
  }
  if (kEngine == Engine::kMmaSyncTma && !KernelProblem::fits(p)) return cudaErrorInvalidValue;
  GemmProblem q = p;
  q.arrival_step = next_arrival_step();
  const KernelArgs<kEngine> kp = kernel_args<kEngine>(q);
  int natural = 1;  // blocks to an SM
  gpuError_t err =
      configure_instance<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>(
          &natural);
  if (err != gpuSuccess) return err;
  const dim3 grid(static_cast<unsigned>(workers),
                  static_cast<unsigned>((p.m + C::kBlockM - 1) / C::kBlockM));
  // Grouped kernels only divide by the group size (>= 32, the binding checks).
  const FastDiv group_div(kGrouped ? static_cast<uint32_t>(p.group_size) : 2u);
  // A producer copies its stages by TMA (StageMaps).
  ProducerMaps<C::kProducer> maps{};
  if constexpr (C::kProducer) {
    const CUtensorMapDataType t16 = std::is_same_v<T, __nv_bfloat16>
                                        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const uint64_t m = static_cast<uint64_t>(p.m), n = static_cast<uint64_t>(p.n),
                   k = static_cast<uint64_t>(p.k);
    const uint64_t groups = kGrouped ? k / static_cast<uint64_t>(p.group_size) : 1;
    err = tma::encode_2d(&maps.a, p.a, t16, m, k, static_cast<uint64_t>(p.lda) * 2, C::kBlockM,
                         kBlockK, true);
    if (err == gpuSuccess) {
      // A 64-column tile of a k-tile is 512 bytes: one 8-byte element a column.
      err = tma::encode_2d(&maps.b, p.b, CU_TENSOR_MAP_DATA_TYPE_UINT64, k / kTileK, n, n * 8,
                           kKSteps, C::kBlockN, false);
    }
    if (err == gpuSuccess && kGrouped) {
      err = tma::encode_2d(&maps.scales, p.scales, t16, groups, n, n * 2, 2, C::kBlockN, false);
    }
    if (err == gpuSuccess && kGrouped && C::kZeros) {
      err = tma::encode_2d(&maps.zeros, p.zeros, CU_TENSOR_MAP_DATA_TYPE_INT32, groups, n / 8,
                           n / 2, 2, C::kBlockN / 8, false);
    }
    if (err != gpuSuccess) return err;
  }
  // Every launch below, with `extra` (a cluster or cooperative launch's attribute) or without,
  // also asks for PDL where use_pdl says so (sm_90 code, APHRODITE_PDL not 0): the grid's blocks
  // may then start while the kernel before it finishes (gemm_kernel waits before its work).
  const bool pdl =
      use_pdl<gemm_kernel<T, kWeight, kGrouped, kMTiles, kMWarps, kNWarps, kKWarps, kEngine>>();
  auto launch = [&](const cudaLaunchAttribute* extra, int smem, bool spread) {
    cudaLaunchAttribute attrs[2];
    unsigned count = 0;
    if (extra != nullptr) attrs[count++] = *extra;
    if (pdl) attrs[count++] = pdl_attribute();
    const cudaLaunchConfig_t config =
        launch_config(grid, C::kBlockThreads, smem, stream, attrs, count);
    return cudaLaunchKernelEx(&config, kernel, kp, group_div, maps, spread);
  };
  // Split-K (workers a multiple of the column tiles: each block within one tile) on sm_90 with
  // 2..kMaxClusterSplits splits: the blocks of a tile as one cluster, reduced through their
  // shared memory (gemm_kernel). The kernel needs nothing else to know: a launch without the
  // cluster (another arch, clusters that would not all be resident at once, or the launch
  // refused) takes the global-memory path, and the plan's workspace is the same either way.
  const int64_t col_blocks = (p.n + C::kBlockN - 1) / C::kBlockN;
  const int64_t splits = workers % col_blocks == 0 ? workers / col_blocks : 1;
  const int64_t blocks = int64_t{grid.x} * grid.y;
  if (sum != SplitSum::kAuto && splits < 2) return cudaErrorNotSupported;  // nothing to sum
  const bool cluster_fits =
      C::kClusterReduce && p.arch >= 90 && splits >= 2 && splits <= kMaxClusterSplits;
  if (sum == SplitSum::kCluster && !cluster_fits) return cudaErrorNotSupported;
  if (cluster_fits && (sum == SplitSum::kAuto || sum == SplitSum::kCluster)) {
    // A cluster's blocks are placed together on one GPC. With each block asking for its own
    // shared memory, cluster grids of 2 to 3 blocks an SM lost up to 24% to the plain launch on
    // an H200 (kernels/marlin/NOTES.md), as if clusters took fewer SMs than a plain launch
    // spreads the blocks over. Each block asks for the shared memory of its grid's share of an
    // SM (ceil(blocks / SMs) blocks to an SM) instead, and the cluster launch is taken only
    // where every cluster of the grid is then resident at once: a second wave, or blocks
    // crowded onto fewer SMs, would cost more than the reduction saves (the plain launch).
    const ClusterShape shape =
        cluster_shape<C>(kernel, natural, p.sm_count, static_cast<int>(splits), blocks);
    if (sum == SplitSum::kCluster ||
        (shape.clusters > 0 && static_cast<int64_t>(shape.clusters) * splits >= blocks)) {
      const cudaLaunchAttribute cluster = cluster_attribute(static_cast<int>(splits));
      const gpuError_t err = launch(&cluster, shape.smem, false);
      if (err == gpuSuccess) return err;
      // Refused: cleared (else the next launch check of any op would report it), then the
      // launches below, or the error where the cluster sum was asked for.
      (void)gpuGetLastError();
      if (sum == SplitSum::kCluster) return err;
    }
  }
  // Other split-K grids sum through global memory. Where every block of the grid is resident at
  // once (a cooperative launch, which the runtime refuses otherwise) and a block has more than 8
  // rows (min(M, block rows)), every block sums a share of its tile once the tile's blocks have
  // all written theirs (`spread`), as a cluster does; else the last block of a tile to arrive
  // sums all of it, which costs less than the wait for a tile of a few rows. H200, same run
  // (2026-11-27, f16 uint4b8, group 128, split 8 of m16n256t, us): 28672x8192 M = 16 42.0 spread
  // against 45.5 last, M = 1 39.4 against 38.2; m64n256w split 4 at M = 64 69.6 against 73.7
  // (kernels/marlin/NOTES.md).
  const bool spread =
      sum == SplitSum::kSpread || (sum == SplitSum::kAuto && splits >= 2 && p.sm_count > 0 &&
                                   (p.m < C::kBlockM ? p.m : C::kBlockM) > 8 &&
                                   blocks <= static_cast<int64_t>(natural) * p.sm_count);
  if (spread) {
    const cudaLaunchAttribute cooperative = cooperative_attribute();
    const gpuError_t err = launch(&cooperative, C::kSmemAlloc, true);
    if (err == gpuSuccess) return err;
    (void)gpuGetLastError();  // refused: cleared; the plain launch below, or the error
    if (sum == SplitSum::kSpread) return err;
  }
  return launch(nullptr, C::kSmemAlloc, false);
}

}  // namespace aphrodite::marlin::detail
