// The tensor-core decode kernel of paged_attention.h (16-bit queries and caches of the same
// dtype, sm_80+): the generator's default, kernel=mma. Torch-free.
//
// Why: the CUDA-core kernels spend about 18 instructions per KV element (conversions, shared
// q reads, fp32 FMAs for every head of the group) and issue-bound an H100 at half its memory
// bandwidth. mma.sync m16n8k16 does the same work in well under one instruction per element.
//
// Design:
// - One thread block of kW warps (4; 8, "wide", where the grid has at most a block an SM: the
//   launcher's choice) per (sequence, kv head, group split of up to 16 query heads, v2
//   partition). The query heads are the mma's 16 rows (rows past the group are zeros: idle
//   tensor-core rows cost nothing the memory system notices).
// - Each warp owns every kW-th step of kU tokens (16, or a whole block of 32) of the partition
//   and runs its own pipeline: its lanes cp.async the step's K and V cache blocks (kHead * kBS
//   contiguous elements each, copied as they are) into the warp's private ring of kSlots slots,
//   kSlots - 1 slots ahead of its compute. Only __syncwarp orders the ring: no block barrier in
//   the main loop. The block's q rows go first, as a copy group of their own: read behind the
//   ring's first copies, q would wait for every block's first round of them.
// - Per step: S[16 heads, kU tokens] = Q K^T (ldmatrix of the key block layout [head / 8,
//   block, 8] gives the B operand directly: 8 tokens x 8 dimensions are 128 contiguous bytes),
//   an online softmax per warp in fp32 (base 2, scale folded in), P rounded to the input dtype
//   as the A operand of O += P V (the value layout [head, block] is the B operand as stored).
// - At the end the warps' (max, sum, O) are combined through shared memory (reusing the ring)
//   and written to `out` (v1, or a sequence that fits one partition) or v2's scratch.
// - Transformer-XL (kXL, an instantiation of its own): u is copied beside q (u_s) and added to
//   it once; each lane reads its matrix_bd elements of the next step while the current one
//   runs, and first uses them at the current step's end.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/paged_attention_kernels.cuh"
#include "common/launch.cuh"

namespace aphrodite::attention::detail {

#if !defined(USE_ROCM)

/// Bytes of ring a warp aims at (kSlots is clamped to [2, kMmaMaxSlots] around it). On an H100
/// (bf16, head 128, block 16, GQA 32/8, batch 32) 24 KiB against 16 KiB a warp, and a cap of
/// 168 registers (3 blocks an SM) against none (184 registers, 2 blocks), were within 3% of
/// each other; batch 1 at 65536 tokens (v2) took 0.134 ms in three of the four builds, 0.187 ms
/// in the fourth (16 KiB, no cap). After the table read-ahead (11da622), same H100 run, v1 at
/// ctx 1024 / 4096 / 16384 against SDPA: 24 KiB (6 slots of a 16-token step) 0.896 / 0.931 /
/// 0.966, 20 KiB (5) 0.900 / 0.944 / 0.968, 16 KiB (4) 0.902 / 0.946 / 0.964; 32-token steps
/// (3 slots of 24 KiB) 0.884 / 0.938 / 0.963.
inline constexpr int kMmaWarpRingBytes = 20480;
inline constexpr int kMmaMaxSlots = 6;
/// Query heads per thread block: the mma's M.
inline constexpr int kMmaRows = 16;

template <typename T, int kHead, int kBS>
struct MmaShape {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit only");
  static_assert(kHead % 16 == 0, "head size must be a multiple of 16");
  static_assert(kBS % 8 == 0, "block size must be a multiple of 8");
  static constexpr int kU = cmax(16, kBS);       ///< tokens of one warp step
  static constexpr int kNT = kU / 8;             ///< S tiles (8 tokens each) of a step
  static constexpr int kKS = kHead / 16;         ///< k steps of Q K^T
  static constexpr int kDT = kHead / 8;          ///< O tiles (8 dimensions each)
  static constexpr int kBlkElems = kHead * kBS;  ///< one kv head's cache block
  static constexpr int kBlk16 = kBlkElems / 8;   ///< its 16-byte pieces
  static constexpr int kSlotElems = kU * kHead;  ///< one step of K or of V
  static constexpr int kSlotBytes = kSlotElems * 2;
  static constexpr int kSlots = cmin(kMmaMaxSlots, cmax(2, kMmaWarpRingBytes / kSlotBytes));
  static constexpr int kCopyIters = kSlotElems / 8 / kWarp;  ///< 16-byte copies per lane
  static_assert(kSlotElems % (8 * kWarp) == 0, "a slot is whole rounds of warp copies");
  static constexpr int kQStride = kHead + 8;  ///< q row in shared memory: padded, no conflicts
  /// A combine row in floats: padded by 8, so that the 8 rows a warp's float2 stores touch at
  /// once fall in distinct banks (unpadded they were 8-way conflicts: ~1.4 us of a ctx-1024
  /// block's ~2.7 us epilogue on an H100).
  static constexpr int kCStride = kHead + 8;
  /// The dynamic shared memory of a block of `warps` warps: their rings, later the combine.
  static constexpr int smem_bytes(int warps) {
    return cmax(warps * kSlots * kSlotBytes, warps * kMmaRows * kCStride * 4);
  }
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// Two 8x8 b16 matrices; lanes 0-7 give the rows of the first, lanes 8-15 of the second.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(p)));
}

/// Four 8x8 b16 matrices; lanes 8i to 8i + 7 give the rows of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/// c += a b for one m16n8k16 tile, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

/// The 16-bit T whose bits are the low half of `bits` (the high half is zero), as a float.
template <typename T>
__device__ __forceinline__ float bits_to_float(uint32_t bits) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
}

/// Two floats as a pair of T in one register (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

/// One thread block: sequence blockIdx.z (+ k * gridDim.z), kv head blockIdx.x / num_splits,
/// query heads [split * 16, ...) of its group, tokens of partition blockIdx.y. kXL: the
/// Transformer-XL kernel (pos_bias_u and matrix_bd set; it adds no ALiBi term, so the launcher
/// sends XL problems with alibi_slopes to the staged kernel), a template of its own so
/// that its bias read-ahead costs plain attention no registers (one kernel for both, with the
/// read-ahead behind a run-time flag, ran plain v1 / v2 1-4% slower on an H200: NOTES.md).
template <typename T, int kHead, int kBS, bool kXL, int kW>
__global__ void __launch_bounds__(kW* kWarp)
    paged_attention_mma_kernel(const PagedAttentionProblem p, const Launch l) {
  pdl_wait();  // the dependents are let go after the main loop
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using M = MmaShape<T, kHead, kBS>;
  static_assert(kW >= 1 && kW * kWarp <= 1024, "a block of 1 to 32 warps");
  constexpr int kBlockThreads = kW * kWarp;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ uint4 smem_raw[];  // the warps' rings, then the combine buffer
  T* const ring_all = reinterpret_cast<T*>(smem_raw);
  float* const combine = reinterpret_cast<float*>(smem_raw);
  __shared__ alignas(16) T q_s[kMmaRows * M::kQStride];
  __shared__ alignas(16) T u_s[kXL ? kMmaRows * M::kQStride : 8];  // XL: pos_bias_u's rows
  __shared__ float m_s[kW][kMmaRows], l_s[kW][kMmaRows];
  __shared__ float row_max[kMmaRows], row_sum[kMmaRows];  // over the warps

  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kvh = static_cast<int>(blockIdx.x) / l.num_splits;
  const int split = static_cast<int>(blockIdx.x) % l.num_splits;
  const int head0 = kvh * group + split * kMmaRows;
  const int ng = cmin(kMmaRows, group - split * kMmaRows);  // heads of this block (>= 1)
  const bool alibi = !kXL && p.alibi_slopes != nullptr;
  const T* __restrict__ kc = static_cast<const T*>(p.key_cache);
  const T* __restrict__ vc = static_cast<const T*>(p.value_cache);
  T* const ring = ring_all + warp * M::kSlots * M::kSlotElems;
  const float scale2 = p.scale * kLog2e;
  // This lane's rows of the mma accumulators (query heads r0 and r0 + 8) and its column pair.
  const int r0 = lane / 4;
  const int c2 = 2 * (lane % 4);

  for (int64_t s = blockIdx.z; s < p.num_seqs; s += gridDim.z) {
    // Block numbers, read ahead: lane j holds those of this warp's step 32c + j (chunk c) in
    // tbl, and those of chunk c + 1 in tbl_next, so that a copy waits on a shuffle instead of a
    // dependent global load. Chunks 0 and 1 are read beside seq_len, not after it (one global
    // load less before the first copy): the reads are bounded by the table's width, not by the
    // sequence, and the producer never uses an entry past the sequence's end.
    const int32_t* __restrict__ table = p.block_tables + s * p.block_table_stride;
    const int first = static_cast<int>(blockIdx.y * l.partition_size);  // the partition's start
    constexpr int kBPS = M::kU / kBS;                                   // cache blocks a step
    int32_t tbl[kBPS], tbl_next[kBPS];
    auto load_table = [&](int32_t (&dst)[kBPS], int chunk) {
      const int64_t col = (first + (warp + kW * (int64_t{chunk} * kWarp + lane)) * M::kU) / kBS;
#pragma unroll
      for (int b = 0; b < kBPS; ++b) {
        dst[b] = col + b < p.block_table_width ? table[col + b] : 0;
      }
    };
    load_table(tbl, 0);
    load_table(tbl_next, 1);
    const int seq_len = p.seq_lens[s];
    const PartitionRange range = partition_range(l, seq_len);
    if (range.skip) continue;
    const int begin = range.begin, end = range.end;
    const bool direct = range.direct;
    if (seq_len == 0) {  // v1 only (v2's reduce writes the zeros)
      write_zero_heads<T, kHead, kBlockThreads>(p, s, head0, ng);
      continue;
    }

    const int nsteps = cdiv(end - begin, M::kU);
    const int mine = warp < nsteps ? cdiv(nsteps - warp, kW) : 0;  // this warp's steps
    // The producer: item 2i is the K of this warp's step i, item 2i + 1 its V.
    int pitem = 0, pslot = 0;
    auto issue = [&]() {
      if (pitem < 2 * mine) {
        const int st = pitem >> 1;
        if ((pitem & 1) == 0 && st % kWarp == 0 && st > 0) {  // the next chunk; read one ahead
#pragma unroll
          for (int b = 0; b < kBPS; ++b) tbl[b] = tbl_next[b];
          load_table(tbl_next, st / kWarp + 1);
        }
        const int t0 = begin + (warp + kW * st) * M::kU;
        const int nblk = cdiv(cmin(M::kU, end - t0), kBS);  // blocks holding tokens < end
        const T* src0 = ((pitem & 1) ? vc : kc) + kvh * p.kv_head_stride;
        T* dst0 = ring + pslot * M::kSlotElems;
        int32_t blk[kBPS];  // the step's blocks, from the lane that holds them
#pragma unroll
        for (int b = 0; b < kBPS; ++b) blk[b] = __shfl_sync(0xffffffffu, tbl[b], st % kWarp);
#pragma unroll
        for (int k = 0; k < M::kCopyIters; ++k) {
          const int i = lane + k * kWarp;
          const int bb = i / M::kBlk16;
          const int piece = i % M::kBlk16;
          int32_t pick = blk[0];
#pragma unroll
          for (int b = 1; b < kBPS; ++b) pick = bb == b ? blk[b] : pick;
          const int64_t phys = pick;
          if (bb < nblk) {
            stage_copy16(dst0 + bb * M::kBlkElems + piece * 8,
                         src0 + phys * p.kv_block_stride + piece * 8);
          }
        }
      }
      stage_commit();  // empty groups at the end keep the wait counts uniform
      ++pitem;
      pslot = pslot + 1 == M::kSlots ? 0 : pslot + 1;
    };
    int cslot = 0;
    // Waits for this lane's copies of the next item, makes every lane's visible to the warp,
    // then refills the slot the warp finished with.
    auto next_item = [&]() -> T* {
      stage_wait<M::kSlots - 2>();
      __syncwarp();
      issue();
      T* slot = ring + cslot * M::kSlotElems;
      cslot = cslot + 1 == M::kSlots ? 0 : cslot + 1;
      return slot;
    };
    // q of the block's heads (rows past the group are zeros; XL: and u), where its rows are
    // 16-byte aligned: copied into q_s (u into u_s) as its own copy group ahead of the first
    // K / V copies. Read after them, as the other cases are, it comes behind every block's
    // first round of copies, and the first step waits for it (an H100, ctx 1024: ~9 us from the
    // block's start to its first step).
    const T* const q_seq = static_cast<const T*>(p.query) + s * p.q_seq_stride;
    const T* const u_seq = kXL ? static_cast<const T*>(p.pos_bias_u) + s * p.u_seq_stride : nullptr;
    const bool q_async =
        reinterpret_cast<uintptr_t>(q_seq) % 16 == 0 && p.q_head_stride % 8 == 0 &&
        (!kXL || (reinterpret_cast<uintptr_t>(u_seq) % 16 == 0 && p.u_head_stride % 8 == 0));
    if (q_async) {
      for (int c = tid; c < kMmaRows * kHead / 8; c += kBlockThreads) {
        const int g = c / (kHead / 8), d = c % (kHead / 8) * 8;
        T* const dst = q_s + g * M::kQStride + d;
        if (g < ng) {
          stage_copy16(dst, q_seq + (head0 + g) * p.q_head_stride + d);
          if constexpr (kXL)
            stage_copy16(u_s + g * M::kQStride + d, u_seq + (head0 + g) * p.u_head_stride + d);
        } else {
          *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      stage_commit();
    }
#pragma unroll 1
    for (int i = 0; i + 1 < M::kSlots; ++i) issue();

    // XL: the bits of matrix_bd at this lane's score elements of the warp's step `step`, in
    // pairs: bd[n][h] holds tokens c2 and c2 + 1 of tile n in row r0 + 8h (0 past the rows, the
    // range or the warp's steps). Read one step ahead: read where the step adds them, every
    // step's softmax waited for their round trip to memory (an H200 ran xl_paged_attention_v1
    // at 0.74-0.77 of SDPA's rate, v1 at 0.94-0.96). The first step's are read here, behind the
    // ring's first copies.
    const uint16_t* const bd_seq =
        kXL ? static_cast<const uint16_t*>(p.matrix_bd) + s * p.bd_seq_stride : nullptr;
    auto load_bd = [&](int step, uint32_t (&raw)[M::kNT][4]) {
      const int t0 = begin + (warp + kW * step) * M::kU;
#pragma unroll
      for (int n = 0; n < M::kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = r0 + (e >= 2 ? 8 : 0);
          const int j = t0 + n * 8 + c2 + (e & 1);
          raw[n][e] = step < mine && row < ng && j < end
                          ? bd_seq[(head0 + row) * p.bd_head_stride + j]
                          : uint16_t{0};
        }
      }
    };
    // The loads' first use is the packing at the end of the step: anywhere earlier, the warp
    // would wait for them there.
    auto pack_bd = [](uint32_t (&bd)[M::kNT][2], const uint32_t (&raw)[M::kNT][4]) {
#pragma unroll
      for (int n = 0; n < M::kNT; ++n) {
        bd[n][0] = raw[n][0] | raw[n][1] << 16;
        bd[n][1] = raw[n][2] | raw[n][3] << 16;
      }
    };
    uint32_t bd[M::kNT][2], bd_first[M::kNT][4];
    if constexpr (kXL) load_bd(0, bd_first);  // packed once q_s is complete

    if (q_async) {
      stage_wait<M::kSlots - 1>();  // the q group (the K / V groups after it may be in flight)
      if constexpr (kXL) {          // q + u, rounded once, from the chunks this thread copied
        for (int c = tid; c < ng * kHead / 8; c += kBlockThreads) {
          const int i = c / (kHead / 8) * M::kQStride + c % (kHead / 8) * 8;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            q_s[i + k] = from_float<T>(to_float(q_s[i + k]) + to_float(u_s[i + k]));
          }
        }
      }
    } else {  // q (+ u for XL) in the input dtype
      for (int i = tid; i < kMmaRows * kHead; i += kBlockThreads) {
        const int g = i / kHead, d = i % kHead;
        const float v = g < ng ? query_value<T>(p, s, head0 + g, d, kXL) : 0.0f;
        q_s[g * M::kQStride + d] = from_float<T>(v);
      }
    }
    __syncthreads();  // q_s is complete
    if constexpr (kXL) pack_bd(bd, bd_first);

    float acc[M::kDT][4];
#pragma unroll
    for (int i = 0; i < M::kDT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running max (base 2, scaled) of rows r0, r0 + 8
    float l0 = 0.0f, l1 = 0.0f;            // this lane's share of the running sums

#pragma unroll 1
    for (int it = 0; it < mine; ++it) {
      const int tb = begin + (warp + kW * it) * M::kU;  // the step's first token
      uint32_t bd_next[M::kNT][4];
      if constexpr (kXL) load_bd(it + 1, bd_next);
      // S = Q K^T.
      const T* ks = next_item();
      float sc[M::kNT][4];
#pragma unroll
      for (int n = 0; n < M::kNT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < M::kKS; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, q_s + (lane % 16) * M::kQStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int n = 0; n < M::kNT; ++n) {
          const int t = n * 8 + lane % 8;          // token of the step
          const int dc = 2 * kk + (lane / 8) % 2;  // 8-dimension piece
          uint32_t b0, b1;
          ldmatrix_x2(b0, b1, ks + (t / kBS) * M::kBlkElems + (dc * kBS + t % kBS) * 8);
          mma_16816<T>(sc[n], a, b0, b1);
        }
      }
      // Scale (base 2), biases, the end mask; the row max over the step.
      float x0 = m0, x1 = m1;
#pragma unroll
      for (int n = 0; n < M::kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = r0 + (e >= 2 ? 8 : 0);
          const int j = tb + n * 8 + c2 + (e & 1);  // token within the sequence
          float v = sc[n][e] * scale2;
          if constexpr (kXL) {
            const uint32_t pair = bd[n][e >> 1];
            v = (sc[n][e] + bits_to_float<T>((e & 1) ? pair >> 16 : pair & 0xffffu)) * scale2;
          } else if (alibi && row < ng && j < end) {
            // The null check again: in this form ptxas spilled less at head size 256 (block 16:
            // 96 / 220 bytes stored / loaded, against 120 / 268 without it; sm_90a).
            float b = 0.0f;
            if (p.alibi_slopes != nullptr)
              b = p.alibi_slopes[head0 + row] * static_cast<float>(j - seq_len + 1);
            v += b * kLog2e;
          }
          v = j < end ? v : -INFINITY;
          sc[n][e] = v;
          if (e < 2) {
            x0 = fmaxf(x0, v);
          } else {
            x1 = fmaxf(x1, v);
          }
        }
      }
      x0 = fmaxf(x0, APHRODITE_SHFL_XOR(x0, 1));
      x0 = fmaxf(x0, APHRODITE_SHFL_XOR(x0, 2));
      x1 = fmaxf(x1, APHRODITE_SHFL_XOR(x1, 1));
      x1 = fmaxf(x1, APHRODITE_SHFL_XOR(x1, 2));
      // Online softmax: rescale what came before, P = 2^(s - max).
      const float alpha0 = m0 == -INFINITY ? 0.0f : exp2f(m0 - x0);
      const float alpha1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - x1);
      m0 = x0;
      m1 = x1;
      const float base0 = x0 == -INFINITY ? 0.0f : x0;
      const float base1 = x1 == -INFINITY ? 0.0f : x1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int n = 0; n < M::kNT; ++n) {
        sc[n][0] = exp2f(sc[n][0] - base0);
        sc[n][1] = exp2f(sc[n][1] - base0);
        sc[n][2] = exp2f(sc[n][2] - base1);
        sc[n][3] = exp2f(sc[n][3] - base1);
        sum0 += sc[n][0] + sc[n][1];
        sum1 += sc[n][2] + sc[n][3];
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int i = 0; i < M::kDT; ++i) {
        acc[i][0] *= alpha0;
        acc[i][1] *= alpha0;
        acc[i][2] *= alpha1;
        acc[i][3] *= alpha1;
      }

      // O += P V.
      T* vs = next_item();
      const int valid = end - tb;
      if (valid < M::kU) {
        // The sequence's last step: the unused slots of its last block (and blocks past it,
        // never copied) may hold anything, NaN included, and P = 0 does not cancel NaN.
        for (int i = lane; i < (M::kU - valid) * kHead; i += kWarp) {
          const int t = valid + i / kHead, d = i % kHead;
          vs[(t / kBS) * M::kBlkElems + d * kBS + t % kBS] = T{};
        }
        __syncwarp();
      }
#pragma unroll
      for (int kk = 0; kk < M::kU / 16; ++kk) {
        const uint32_t a[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]),
                               pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                               pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
        const int t = kk * 16 + ((lane / 8) % 2) * 8;  // first token of this lane's matrix row
#pragma unroll
        for (int i = 0; i < M::kDT; ++i) {
          const int d = i * 8 + lane % 8;
          uint32_t b0, b1;
          ldmatrix_x2(b0, b1, vs + (t / kBS) * M::kBlkElems + d * kBS + t % kBS);
          mma_16816<T>(acc[i], a, b0, b1);
        }
      }
      if constexpr (kXL) pack_bd(bd, bd_next);
    }
    stage_wait<0>();  // only empty groups remain; nothing may be in flight into the next use
    pdl_launch_dependents();  // the main loop is done: the next kernel may take room now

    // Combine the warps: each row's max over the warps, then the warps' rescaled sums.
    l0 += APHRODITE_SHFL_XOR(l0, 1);
    l0 += APHRODITE_SHFL_XOR(l0, 2);
    l1 += APHRODITE_SHFL_XOR(l1, 1);
    l1 += APHRODITE_SHFL_XOR(l1, 2);
    if (lane % 4 == 0) {
      m_s[warp][r0] = m0;
      m_s[warp][r0 + 8] = m1;
      l_s[warp][r0] = l0;
      l_s[warp][r0 + 8] = l1;
    }
    __syncthreads();  // m_s and l_s are complete; every warp is done with its ring
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      mx0 = fmaxf(mx0, m_s[w][r0]);
      mx1 = fmaxf(mx1, m_s[w][r0 + 8]);
    }
    const float w0 = m0 == -INFINITY ? 0.0f : exp2f(m0 - mx0);
    const float w1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - mx1);
    if (warp == 0 && lane % 4 == 0) {  // rows r0 and r0 + 8: their max and rescaled sum, once
      float total0 = 0.0f, total1 = 0.0f;
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const float mw0 = m_s[w][r0], mw1 = m_s[w][r0 + 8];
        total0 += mw0 == -INFINITY ? 0.0f : l_s[w][r0] * exp2f(mw0 - mx0);
        total1 += mw1 == -INFINITY ? 0.0f : l_s[w][r0 + 8] * exp2f(mw1 - mx1);
      }
      row_max[r0] = mx0;
      row_max[r0 + 8] = mx1;
      row_sum[r0] = total0;
      row_sum[r0 + 8] = total1;
    }
    float* cw = combine + warp * kMmaRows * M::kCStride;
#pragma unroll
    for (int i = 0; i < M::kDT; ++i) {
      const int d = i * 8 + c2;
      *reinterpret_cast<float2*>(cw + r0 * M::kCStride + d) =
          make_float2(acc[i][0] * w0, acc[i][1] * w0);
      *reinterpret_cast<float2*>(cw + (r0 + 8) * M::kCStride + d) =
          make_float2(acc[i][2] * w1, acc[i][3] * w1);
    }
    __syncthreads();

    // Write: out (v1, or a sequence of one partition) or the partition's scratch.
#pragma unroll 4
    for (int i = tid; i < ng * kHead; i += kBlockThreads) {
      const int g = i / kHead, d = i % kHead;
      float num = 0.0f;
#pragma unroll
      for (int w = 0; w < kW; ++w) num += combine[(w * kMmaRows + g) * M::kCStride + d];
      const float total = row_sum[g];
      const float v = total > 0.0f ? num / total : 0.0f;
      // The max is held in base-2 units; the reduce works in natural-log ones.
      store_result<T, kHead>(p, l, s, head0 + g, d, v, direct, row_max[g] / kLog2e, total);
    }
    __syncthreads();  // q_s, m_s, l_s and the combine buffer are reused by the next sequence
  }
#endif
}

#endif  // !USE_ROCM

}  // namespace aphrodite::attention::detail
