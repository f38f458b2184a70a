// GPU kernels of paged_attention.h as header templates. codegen/paged_attention.py emits one .cu
// per (query dtype, head size) that instantiates paged_attention_run for every block size and
// cache dtype of the build, and a dispatch file that implements the two launchers.
//
// Design (decode is a stream over the KV cache; the aim is to read each KV byte once):
// - One thread block serves every query head of one kv head (up to kG of them; a larger GQA
//   group is split over ceil(G / kG) blocks that run side by side and share the KV through L2),
//   so under GQA the cache is read once, not G times.
// - A block walks its token range in chunks of kChunk tokens. Per chunk: (1) each warp takes
//   whole cache blocks, loads their keys with 16-byte loads (lane = token slot, a warp
//   instruction reads 512 contiguous bytes of the [head_size / x, block_size, x] layout) and
//   dots them with q (fp32, in shared memory, pre-scaled) for all heads of the group; (2) an
//   exact softmax step per head over the chunk updates the running max and sum (online softmax
//   across chunks); (3) warps (or teams of warps, when one warp would need too many
//   accumulators) take whole cache blocks again and accumulate p * v in fp32 registers.
// - v1 walks the whole sequence in one block per (sequence, kv head group): no scratch, but
//   only num_seqs * num_kv_heads blocks. v2 gives each partition of scratch.partition_size
//   tokens its own block, writes (max, sum, normalised partial output) to the scratch, and a
//   reduce kernel combines them; a sequence that fits one partition is written to `out`
//   directly and skipped by the reduce. v2 is the fast path for long contexts or small batches.
// - Two kernels implement this: paged_attention_kernel loads K and V into registers (209-245 of
//   them a thread at head size 128: 8 warps an SM, too few loads in flight to fill an H100's
//   memory system); paged_attention_staged_kernel (below) stages them through a shared-memory
//   ring with cp.async. Both spend about 18 instructions per KV element on CUDA cores, so the
//   default build (paged_attention.kernel=mma) runs fp16/bf16 over same-dtype caches with the
//   tensor-core kernel of paged_attention_mma.cuh and keeps staged for fp32 and fp8 caches.
//   paged_attention_launch.cuh picks the kernel.
// Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/paged_attention.h"
#include "common/fp8.h"
#include "common/gpu.h"
#include "common/launch.cuh"

namespace aphrodite::attention {
namespace detail {

#if defined(USE_ROCM)
constexpr gpuError_t kErrorInvalidValue = hipErrorInvalidValue;
#else
constexpr gpuError_t kErrorInvalidValue = cudaErrorInvalidValue;
#endif

/// Threads per block (4 warps of 32 lanes; on 64-lane wavefronts each half acts as one warp:
/// every shuffle below stays within 32 lanes).
inline constexpr int kThreads = 128;
inline constexpr int kWarp = 32;
inline constexpr int kWarps = kThreads / kWarp;
/// Tokens per chunk: the softmax step's unit and the size of the score buffer.
inline constexpr int kChunk = 256;
/// Resident blocks per SM the attention kernel is compiled for (its __launch_bounds__): 1 lets
/// ptxas take up to 255 registers a thread (today 209-245 at head size 128: 2 blocks, 8 warps
/// an SM); 3 or 4 cap a thread at 168 or 128 registers for 12 or 16 warps an SM, at the price
/// of some spills (a few hundred bytes a thread at head size 128). The generator option
/// paged_attention.min_blocks sets it per build, so that the variants can be measured.
#ifndef APHRODITE_PAGED_ATTENTION_MIN_BLOCKS
#define APHRODITE_PAGED_ATTENTION_MIN_BLOCKS 1
#endif
static_assert(APHRODITE_PAGED_ATTENTION_MIN_BLOCKS >= 1 &&
                  APHRODITE_PAGED_ATTENTION_MIN_BLOCKS <= 8,
              "paged_attention.min_blocks: 1 to 8 blocks of 128 threads");
/// 1: the attention launcher runs paged_attention_staged_kernel (generator option
/// paged_attention.kernel=staged, the default; CUDA only), 0: paged_attention_kernel (=regs).
#if !defined(APHRODITE_PAGED_ATTENTION_STAGED) || defined(USE_ROCM)
#undef APHRODITE_PAGED_ATTENTION_STAGED
#define APHRODITE_PAGED_ATTENTION_STAGED 0
#endif
/// Grid limit on sequences (blockIdx.z); the kernels loop beyond it.
inline constexpr int64_t kMaxGridZ = 65535;

/// N consecutive cache or query elements moved with one load.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
#if !defined(USE_ROCM)
__device__ __forceinline__ float to_float(uint8_t v) { return fp8::to_float(v); }
#endif

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half(v);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "unsupported element type");
    return __float2bfloat16(v);
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, APHRODITE_SHFL_XOR(v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += APHRODITE_SHFL_XOR(v, o);
  return v;
}

__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

/// The softmax step of a chunk of n scores (score_s[g][0, n) for the block's ng heads): warp w
/// updates heads w, w + kWarps, ...: the running max and sum (online softmax across chunks),
/// alpha_s[g] = exp(old max - new max) for rescaling the accumulators, and score_s[g][t] =
/// exp(score - max) for t < n, 0 for n <= t < nfill (the PV step reads whole cache blocks).
/// The caller synchronises the block before and after.
__device__ __forceinline__ void chunk_softmax(float (*score_s)[kChunk], float* run_max,
                                              float* run_sum, float* alpha_s, int ng, int n,
                                              int nfill, int warp, int lane) {
  for (int g = warp; g < ng; g += kWarps) {
    float m = -INFINITY;
    for (int t = lane; t < n; t += kWarp) m = fmaxf(m, score_s[g][t]);
    m = warp_max(m);
    const float m_old = run_max[g];
    const float m_new = fmaxf(m_old, m);
    float sum = 0.0f;
    for (int t = lane; t < nfill; t += kWarp) {
      float e = 0.0f;
      if (t < n && m_new != -INFINITY) {
        e = __expf(score_s[g][t] - m_new);
        sum += e;
      }
      score_s[g][t] = e;
    }
    sum = warp_sum(sum);
    // Every lane read run_max[g] above; lane 0 overwrites it below. The shuffles of warp_sum
    // do not order shared memory, so without this the write may race the other lanes' read
    // (compute-sanitizer racecheck reports it).
    __syncwarp();
    if (lane == 0) {
      const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
      alpha_s[g] = alpha;
      run_sum[g] = run_sum[g] * alpha + sum;
      run_max[g] = m_new;
    }
  }
}

/// The compile-time shape of one kernel instantiation: query element T, cache element CacheT
/// (T, or uint8_t for fp8 E4M3), head size, block size, and kG query heads per thread block.
template <typename T, typename CacheT, int kHead, int kBS, int kG>
struct Shape {
  static constexpr bool kFp8 = std::is_same_v<CacheT, uint8_t>;
  /// Elements per 16 bytes: the key cache's innermost dimension x.
  static constexpr int kX = 16 / static_cast<int>(sizeof(CacheT));
  static_assert(kHead % kX == 0, "head size must be a multiple of 16 bytes of cache elements");
  static_assert(kWarp % kBS == 0 && kChunk % kBS == 0, "block size must divide 32");
  /// Key pieces (16 bytes) per cache block: kNC of them per token.
  static constexpr int kNC = kHead / kX;
  /// QK step: lanes that share a token slot (lane = slot + kBS * j) and pieces per lane.
  static constexpr int kLanesPerTok = kWarp / kBS;
  static constexpr int kKIters = cdiv(kNC, kLanesPerTok);
  static constexpr int kBlocksPerChunk = kChunk / kBS;
  /// Cache blocks a warp loads at once (q values read from shared memory serve all of them),
  /// and key pieces per lane and block in one batch: at most 8 loads in flight per lane, so
  /// that four blocks of 128 threads fit an SM (128 registers a thread).
  static constexpr int kKBlk = cmin(2, cmax(1, kBlocksPerChunk / kWarps));
  static constexpr int kKBatch = cmin(kKIters, cmax(1, 8 / kKBlk));
  static constexpr int kKBatches = cdiv(kKIters, kKBatch);
  /// PV step: a value vector holds kVE tokens of one dimension (16 bytes, or a whole block row
  /// when that is shorter), kSeg of them per row; a team of kVTeam warps shares a cache block.
  static constexpr int kVE = cmin(kX, kBS);
  static constexpr int kSeg = kBS / kVE;
  static constexpr int kNPV = kHead * kSeg;
  static constexpr int team_for(int w) {
    return (w >= kWarps || cdiv(kNPV, kWarp * w) * kG <= 16) ? w : team_for(w * 2);
  }
  static constexpr int kVTeam = cmin(team_for(1), kWarps);
  static constexpr int kTeams = kWarps / kVTeam;
  static constexpr int kVIters = cdiv(kNPV, kWarp* kVTeam);
  static constexpr int kVBlk = cmin(cmax(1, 8 / kVIters), cmax(1, kBlocksPerChunk / kTeams));
};

/// Arguments of the attention kernel beyond the problem.
struct Launch {
  float* exp_sums;  ///< v2 scratch, or nullptr (v1: write `out`)
  float* max_logits;
  float* tmp_out;
  int64_t max_num_partitions;
  int64_t partition_size;  ///< tokens per thread block; v1: a bound above every sequence
  int num_splits;          ///< blocks per kv head (ceil(G / kG))
};

/// The tokens [begin, end) of a sequence of seq_len tokens that this block's partition
/// (blockIdx.y) covers. skip: a partition past the sequence's end, which the reduce never
/// reads (v1's block of an empty sequence is not skipped: it writes the zeros). direct: the
/// result goes to `out` (v1, or a sequence of one partition) instead of v2's scratch.
struct PartitionRange {
  int begin;
  int end;
  bool skip;
  bool direct;
};

__device__ __forceinline__ PartitionRange partition_range(const Launch& l, int seq_len) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * l.partition_size;
  PartitionRange r;
  r.skip = begin >= seq_len && !(seq_len == 0 && blockIdx.y == 0 && l.exp_sums == nullptr);
  r.begin = static_cast<int>(begin);
  r.end = static_cast<int>(seq_len < begin + l.partition_size ? seq_len : begin + l.partition_size);
  r.direct = l.exp_sums == nullptr || seq_len <= l.partition_size;
  return r;
}

/// v1 on an empty sequence: zeros in `out` for heads [head0, head0 + ng) of sequence s, by a
/// block of kBlockThreads threads.
template <typename T, int kHead, int kBlockThreads = kThreads>
__device__ __forceinline__ void write_zero_heads(const PagedAttentionProblem& p, int64_t s,
                                                 int head0, int ng) {
  for (int i = threadIdx.x; i < ng * kHead; i += kBlockThreads) {
    T* o = static_cast<T*>(p.out) + s * p.num_heads * kHead +
           static_cast<int64_t>(head0 + i / kHead) * kHead + i % kHead;
    *o = from_float<T>(0.0f);
  }
}

/// q[s, h, d], plus pos_bias_u[s, h, d] for XL, in fp32.
template <typename T>
__device__ __forceinline__ float query_value(const PagedAttentionProblem& p, int64_t s, int64_t h,
                                             int d, bool xl) {
  float v = to_float(static_cast<const T*>(p.query)[s * p.q_seq_stride + h * p.q_head_stride + d]);
  if (xl) {
    v +=
        to_float(static_cast<const T*>(p.pos_bias_u)[s * p.u_seq_stride + h * p.u_head_stride + d]);
  }
  return v;
}

/// Element d of head h's result for sequence s: into `out` (direct), else into the partition's
/// scratch row, with (once, from d == 0) its max logit, in natural-log units, and exp sum.
template <typename T, int kHead>
__device__ __forceinline__ void store_result(const PagedAttentionProblem& p, const Launch& l,
                                             int64_t s, int64_t h, int d, float v, bool direct,
                                             float max_logit, float exp_sum) {
  if (direct) {
    static_cast<T*>(p.out)[(s * p.num_heads + h) * kHead + d] = from_float<T>(v);
  } else {
    const int64_t row = (s * p.num_heads + h) * l.max_num_partitions + blockIdx.y;
    l.tmp_out[row * kHead + d] = v;
    if (d == 0) {
      l.max_logits[row] = max_logit;
      l.exp_sums[row] = exp_sum;
    }
  }
}

/// One thread block: sequence blockIdx.z (+ k * gridDim.z), kv head blockIdx.x / num_splits,
/// query heads [split * kG, ...) of its group, tokens of partition blockIdx.y.
template <typename T, typename CacheT, int kHead, int kBS, int kG>
__global__ void
#if APHRODITE_PAGED_ATTENTION_MIN_BLOCKS > 1
__launch_bounds__(kThreads, APHRODITE_PAGED_ATTENTION_MIN_BLOCKS)
#else
__launch_bounds__(kThreads)  // as before the option: (kThreads, 1) compiles a little differently
#endif
    paged_attention_kernel(const PagedAttentionProblem p, const Launch l) {
  pdl_wait();  // before any read: the cache and the query may be the last kernel's writes
  using S = Shape<T, CacheT, kHead, kBS, kG>;
  __shared__ alignas(16) float q_s[kG][kHead];
  __shared__ alignas(16) float score_s[kG][kChunk];
  __shared__ alignas(16) float red_s[kG][kHead];
  __shared__ float run_max[kG], run_sum[kG], alpha_s[kG];

  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kvh = static_cast<int>(blockIdx.x) / l.num_splits;
  const int split = static_cast<int>(blockIdx.x) % l.num_splits;
  const int head0 = kvh * group + split * kG;
  const int ng = cmin(kG, group - split * kG);  // heads of this block (>= 1)
  const bool xl = p.pos_bias_u != nullptr;
  const CacheT* __restrict__ kc = static_cast<const CacheT*>(p.key_cache);
  const CacheT* __restrict__ vc = static_cast<const CacheT*>(p.value_cache);
  float k_scale = 1.0f, v_scale = 1.0f;
  if constexpr (S::kFp8) {
    k_scale = *p.k_scale;
    v_scale = *p.v_scale;
  }

  for (int64_t s = blockIdx.z; s < p.num_seqs; s += gridDim.z) {
    const int seq_len = p.seq_lens[s];
    const PartitionRange range = partition_range(l, seq_len);
    if (range.skip) continue;
    const int begin = range.begin, end = range.end;
    const bool direct = range.direct;
    if (seq_len == 0) {  // v1 only (v2's reduce writes the zeros)
      write_zero_heads<T, kHead>(p, s, head0, ng);
      continue;
    }

    // q (+ u for XL) of the group's heads, in fp32, times scale (and k_scale for fp8 caches).
    const float qmul = p.scale * k_scale;
    for (int i = tid; i < kG * kHead; i += kThreads) {
      const int g = i / kHead, d = i % kHead;
      const float v = g < ng ? query_value<T>(p, s, head0 + g, d, xl) : 0.0f;
      q_s[g][d] = v * qmul;
    }
    if (tid < kG) {
      run_max[tid] = -INFINITY;
      run_sum[tid] = 0.0f;
    }
    float acc[S::kVIters][kG];
#pragma unroll
    for (int i = 0; i < S::kVIters; ++i)
#pragma unroll
      for (int g = 0; g < kG; ++g) acc[i][g] = 0.0f;
    __syncthreads();

    const int32_t* __restrict__ table = p.block_tables + s * p.block_table_stride;
    const float* slopes = p.alibi_slopes;
    for (int c0 = begin; c0 < end; c0 += kChunk) {
      const int n = cmin(kChunk, end - c0);  // valid tokens of this chunk
      const int nb = cdiv(n, kBS);           // cache blocks it touches
      const int first_block = c0 / kBS;      // c0 is a multiple of kBS

      // (1) scores of the chunk: warp `warp` takes cache blocks warp + kWarps * (k * kKBlk + u).
      {
        const int slot = lane % kBS;
        const int cl = lane / kBS;  // first key piece of this lane
        for (int b0 = warp; b0 < nb; b0 += kWarps * S::kKBlk) {
          const CacheT* base[S::kKBlk];
#pragma unroll
          for (int u = 0; u < S::kKBlk; ++u) {
            const int b = b0 + u * kWarps;
            base[u] = nullptr;
            if (b < nb) {
              const int64_t phys = table[first_block + b];
              base[u] = kc + phys * p.kv_block_stride + kvh * p.kv_head_stride + slot * S::kX;
            }
          }
          float dot[S::kKBlk][kG];
#pragma unroll
          for (int u = 0; u < S::kKBlk; ++u)
#pragma unroll
            for (int g = 0; g < kG; ++g) dot[u][g] = 0.0f;
#pragma unroll
          for (int batch = 0; batch < S::kKBatches; ++batch) {
            Pack<CacheT, S::kX> kr[S::kKBlk][S::kKBatch];
#pragma unroll
            for (int u = 0; u < S::kKBlk; ++u) {
#pragma unroll
              for (int i = 0; i < S::kKBatch; ++i) {
                const int c = cl + S::kLanesPerTok * (batch * S::kKBatch + i);
                if (base[u] != nullptr && c < S::kNC) {
                  kr[u][i] = *reinterpret_cast<const Pack<CacheT, S::kX>*>(
                      base[u] + static_cast<int64_t>(c) * kBS * S::kX);
                }
              }
            }
#pragma unroll
            for (int i = 0; i < S::kKBatch; ++i) {
              const int c = cl + S::kLanesPerTok * (batch * S::kKBatch + i);
              if (c < S::kNC) {
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                  if (g < ng) {
#pragma unroll
                    for (int e4 = 0; e4 < S::kX; e4 += 4) {
                      const float4 qv = *reinterpret_cast<const float4*>(&q_s[g][c * S::kX + e4]);
#pragma unroll
                      for (int u = 0; u < S::kKBlk; ++u) {
                        if (base[u] != nullptr) {
                          dot[u][g] += qv.x * to_float(kr[u][i].v[e4]) +
                                       qv.y * to_float(kr[u][i].v[e4 + 1]) +
                                       qv.z * to_float(kr[u][i].v[e4 + 2]) +
                                       qv.w * to_float(kr[u][i].v[e4 + 3]);
                        }
                      }
                    }
                  }
                }
              }
            }
          }
#pragma unroll
          for (int u = 0; u < S::kKBlk; ++u) {
#pragma unroll
            for (int g = 0; g < kG; ++g) {
#pragma unroll
              for (int o = kBS; o < kWarp; o <<= 1) dot[u][g] += APHRODITE_SHFL_XOR(dot[u][g], o);
            }
            const int b = b0 + u * kWarps;
            const int t = b * kBS + slot;  // token within the chunk
            if (b < nb && lane < kBS && t < n) {
              const int j = c0 + t;  // token within the sequence
#pragma unroll
              for (int g = 0; g < kG; ++g) {
                if (g < ng) {
                  const int64_t h = head0 + g;
                  float sc = dot[u][g];
                  if (slopes != nullptr) sc += slopes[h] * static_cast<float>(j - seq_len + 1);
                  if (xl) {
                    sc +=
                        p.scale * to_float(static_cast<const T*>(
                                      p.matrix_bd)[s * p.bd_seq_stride + h * p.bd_head_stride + j]);
                  }
                  score_s[g][t] = sc;
                }
              }
            }
          }
        }
      }
      __syncthreads();

      // (2) softmax step over this chunk (chunk_softmax).
      chunk_softmax(score_s, run_max, run_sum, alpha_s, ng, n, nb * kBS, warp, lane);
      __syncthreads();

      // (3) acc = acc * alpha + p . v: team `team` takes cache blocks team + kTeams * k.
      {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float a = g < ng ? alpha_s[g] : 0.0f;
#pragma unroll
          for (int i = 0; i < S::kVIters; ++i) acc[i][g] *= a;
        }
        const int team = warp / S::kVTeam;
        const int tt = tid % (S::kVTeam * kWarp);  // thread within the team
        const int seg = tt % S::kSeg;              // the same for all of its pieces
        for (int b0 = team; b0 < nb; b0 += S::kTeams * S::kVBlk) {
          // Every load of the step is issued before any of them is used.
          Pack<CacheT, S::kVE> vr[S::kVBlk][S::kVIters];
#pragma unroll
          for (int u = 0; u < S::kVBlk; ++u) {
            const int b = b0 + u * S::kTeams;
            if (b < nb) {
              const int64_t phys = table[first_block + b];
              const CacheT* vb = vc + phys * p.kv_block_stride + kvh * p.kv_head_stride;
#pragma unroll
              for (int i = 0; i < S::kVIters; ++i) {
                const int pi = tt + S::kVTeam * kWarp * i;
                if (pi < S::kNPV) {
                  // piece pi = (d, seg): row d of the block, tokens [seg * kVE, +kVE)
                  vr[u][i] = *reinterpret_cast<const Pack<CacheT, S::kVE>*>(
                      vb + static_cast<int64_t>(pi / S::kSeg) * kBS + seg * S::kVE);
                }
              }
            }
          }
#pragma unroll
          for (int u = 0; u < S::kVBlk; ++u) {
            const int b = b0 + u * S::kTeams;
            if (b >= nb) break;
            const int t0 = b * kBS + seg * S::kVE;  // first token of the pieces, in the chunk
            if (t0 + S::kVE > n) {
              // The sequence's last, partial block: its unused slots may hold anything (NaN),
              // and p = 0 does not cancel NaN.
#pragma unroll
              for (int i = 0; i < S::kVIters; ++i)
#pragma unroll
                for (int e = 0; e < S::kVE; ++e)
                  if (t0 + e >= n) vr[u][i].v[e] = CacheT{};
            }
#pragma unroll
            for (int g = 0; g < kG; ++g) {
              if (g < ng) {
                float pr[S::kVE];
#pragma unroll
                for (int e4 = 0; e4 < S::kVE; e4 += 4) {
                  const float4 pv = *reinterpret_cast<const float4*>(&score_s[g][t0 + e4]);
                  pr[e4] = pv.x;
                  pr[e4 + 1] = pv.y;
                  pr[e4 + 2] = pv.z;
                  pr[e4 + 3] = pv.w;
                }
#pragma unroll
                for (int i = 0; i < S::kVIters; ++i) {
                  float sum = 0.0f;
#pragma unroll
                  for (int e = 0; e < S::kVE; ++e) sum += pr[e] * to_float(vr[u][i].v[e]);
                  acc[i][g] += sum;
                }
              }
            }
          }
        }
      }
      __syncthreads();
    }
    pdl_launch_dependents();  // the main loop is done: the next kernel may take room now

    // Combine: the kSeg lanes of a row (adjacent lanes), then the teams, through red_s.
#pragma unroll
    for (int i = 0; i < S::kVIters; ++i)
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int o = 1; o < S::kSeg; o <<= 1) acc[i][g] += APHRODITE_SHFL_XOR(acc[i][g], o);
    {
      const int team = warp / S::kVTeam;
      const int tt = tid % (S::kVTeam * kWarp);
      for (int k = 0; k < S::kTeams; ++k) {
        if (team == k && tt % S::kSeg == 0) {
#pragma unroll
          for (int i = 0; i < S::kVIters; ++i) {
            const int pi = tt + S::kVTeam * kWarp * i;
            if (pi < S::kNPV) {
              const int d = pi / S::kSeg;
#pragma unroll
              for (int g = 0; g < kG; ++g) {
                red_s[g][d] = k == 0 ? acc[i][g] : red_s[g][d] + acc[i][g];
              }
            }
          }
        }
        __syncthreads();
      }
    }

    // Write: out (v1, or a sequence of one partition) or the partition's scratch.
    for (int i = tid; i < ng * kHead; i += kThreads) {
      const int g = i / kHead, d = i % kHead;
      const int64_t h = head0 + g;
      const float total = run_sum[g];
      const float v = total > 0.0f ? red_s[g][d] * v_scale / total : 0.0f;
      store_result<T, kHead>(p, l, s, h, d, v, direct, run_max[g], total);
    }
    __syncthreads();  // q_s, run_* and red_s are reused by the next sequence
  }
}

/// Threads of the reduce: warp w takes partitions w, w + 8, ...; lane l dimension l of the
/// block's kReduceDims.
inline constexpr int kReduceThreads = 256;
inline constexpr int kReduceWarps = kReduceThreads / kWarp;
/// Dimensions a reduce block covers: blocks = heads x ceil(head_size / 32) x sequences, so that a
/// batch of one long sequence still spreads over the GPU.
inline constexpr int kReduceDims = kWarp;

/// v2's reduce: out[s, h] = sum_p w_p tmp_out[s, h, p] / sum_p w_p, w_p = exp_sum_p *
/// exp(max_p - max). One block per (head, 32 dimensions, sequence); its warps split the
/// partitions so that many loads are in flight even for one sequence. Sequences of one partition
/// were written by the attention kernel; sequences of length 0 get zeros here.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    paged_attention_reduce_kernel(const PagedAttentionProblem p, const Launch l) {
  pdl_prologue();  // the split step's sums are read below
  __shared__ float red[kReduceWarps];
  __shared__ float part[kReduceWarps][kReduceDims];
  const int64_t h = blockIdx.x;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int head = static_cast<int>(p.head_size);
  const int d = static_cast<int>(blockIdx.y) * kReduceDims + lane;  // this lane's dimension
  for (int64_t s = blockIdx.z; s < p.num_seqs; s += gridDim.z) {
    const int64_t seq_len = p.seq_lens[s];
    T* out = static_cast<T*>(p.out) + (s * p.num_heads + h) * head;
    if (seq_len == 0) {
      if (warp == 0 && d < head) out[d] = from_float<T>(0.0f);
      continue;
    }
    if (seq_len <= l.partition_size) continue;
    // Clamped so that a max_seq_len below a sequence's length (a caller's error) cannot make
    // the reduce read past the scratch rows (it reads rows that no block wrote: a wrong result,
    // not an out-of-bounds read; the split step runs the partitions of max_seq_len only).
    int64_t np64 = (seq_len + l.partition_size - 1) / l.partition_size;
    if (np64 > l.max_num_partitions) np64 = l.max_num_partitions;
    const int np = static_cast<int>(np64);
    const int64_t row = (s * p.num_heads + h) * l.max_num_partitions;
    const float* maxes = l.max_logits + row;
    const float* sums = l.exp_sums + row;
    // The largest partition max, then the weights' sum.
    float m = -INFINITY;
    for (int i = threadIdx.x; i < np; i += kReduceThreads) m = fmaxf(m, maxes[i]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < kReduceWarps; ++w) m = fmaxf(m, red[w]);
    __syncthreads();  // red is reused below
    float den = 0.0f;
    for (int i = threadIdx.x; i < np; i += kReduceThreads) {
      den += maxes[i] == -INFINITY ? 0.0f : sums[i] * __expf(maxes[i] - m);
    }
    den = warp_sum(den);
    if (lane == 0) red[warp] = den;
    // Partial numerators: warp `warp` over its partitions, one dimension a lane.
    float num = 0.0f;
    if (d < head) {
#pragma unroll 4
      for (int i = warp; i < np; i += kReduceWarps) {
        const float mi = maxes[i];
        const float w = mi == -INFINITY ? 0.0f : sums[i] * __expf(mi - m);
        num += w * l.tmp_out[(row + i) * head + d];
      }
    }
    part[warp][lane] = num;
    __syncthreads();
    if (warp == 0 && d < head) {
      den = 0.0f;
      num = 0.0f;
#pragma unroll
      for (int w = 0; w < kReduceWarps; ++w) {
        den += red[w];
        num += part[w][lane];
      }
      out[d] = from_float<T>(den > 0.0f ? num / den : 0.0f);
    }
    __syncthreads();  // red and part are reused by the next sequence
  }
}

// ---- The staged kernel (generator option paged_attention.kernel=staged) ----------------------
// The same algorithm and chunk structure as paged_attention_kernel, but K and V reach the
// threads through shared memory: a ring of kStages tiles of kTT tokens each, filled with 16-byte
// cp.async copies (a cache block of one kv head is kHead * kBS contiguous elements in both
// caches, so a tile is a few long contiguous runs). The block walks one sequence of tiles: the
// K tiles of chunk 0, its V tiles, the K tiles of chunk 1, ...; the copies run kStages - 1 tiles
// ahead of the compute, across the softmax step and chunk boundaries, so the bytes in flight no
// longer live in registers (fewer registers, more blocks per SM, more loads outstanding).

/// The staging copy: cp.async (sm_80+, bypassing L1), else a plain 16-byte load and store.
__device__ __forceinline__ void stage_copy16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // No "memory" clobber: it would keep the compiler from issuing the tile's block-table reads
  // ahead of these copies. The slot's previous readers are ordered by the __syncthreads before
  // the copy, its next readers by stage_wait's clobber and the __syncthreads after it.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void stage_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N>
__device__ __forceinline__ void stage_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/// Tiles in the ring (fewer for tiles that a whole cache block makes larger than kTileBytes, so
/// that the ring stays within 64 KiB: 88 KiB a block at most, which every sm_80+ GPU allows).
inline constexpr int kMaxStages = 4;
inline constexpr int kMaxRingBytes = 65536;
/// Bytes a tile aims at (of K or of V): 4 tiles of 16 KiB plus the static buffers let 3 blocks
/// of 128 threads share an H100 SM, each with up to 48 KiB of copies in flight.
inline constexpr int kTileBytes = 16384;

template <typename T, typename CacheT, int kHead, int kBS, int kG>
struct StagedShape {
  using S = Shape<T, CacheT, kHead, kBS, kG>;
  static constexpr int kX = S::kX;
  static constexpr int kNC = S::kNC;
  static constexpr int kTokBytes = kHead * static_cast<int>(sizeof(CacheT));
  static constexpr int pow2_floor(int v) { return v >= 2 ? 2 * pow2_floor(v / 2) : 1; }
  /// Tokens per tile: a power of two in [kBS, 128] (kChunk is a multiple of it), so that a tile
  /// holds whole cache blocks and the QK step has at least one thread per token.
  static constexpr int kTT = cmin(128, cmax(kBS, pow2_floor(kTileBytes / kTokBytes)));
  static constexpr int kTB = kTT / kBS;  ///< cache blocks per tile
  static constexpr int kBlkElems = kHead * kBS;
  static constexpr int kTileElems = kTT * kHead;
  static constexpr int kBlk16 = kBlkElems * static_cast<int>(sizeof(CacheT)) / 16;
  static constexpr int kTileBytesActual = kTileElems * static_cast<int>(sizeof(CacheT));
  static constexpr int kStages = cmin(kMaxStages, cmax(2, kMaxRingBytes / kTileBytesActual));
  static constexpr int kRingBytes = kStages * kTileBytesActual;
  /// 16-byte copies per thread and tile.
  static constexpr int kCopyIters = cdiv(kTB * kBlk16, kThreads);
  /// QK step: kLPT threads per token (one token per thread group), adjacent in lane order by
  /// token: lane = token_in_warp + kTPW * j, and piece c = j + kLPT * i.
  static constexpr int kLPT = kThreads / kTT;
  static constexpr int kTPW = kWarp / kLPT;  ///< tokens per warp
  static constexpr int kKIters = cdiv(kNC, kLPT);
  /// PV step: kTG token groups of kDThreads threads; thread (tg, dl) owns dimensions
  /// dl + kDThreads * i and the kVE-token segments sg of each tile with sg % kTG == tg.
  static constexpr int kTG = cmax(1, kThreads / kHead);
  static constexpr int kDThreads = kThreads / kTG;
  static constexpr int kDIters = cdiv(kHead, kDThreads);
  static constexpr int kVE = S::kVE;  ///< tokens per value vector (within one cache block)
  static constexpr int kSegs = kTT / kVE;
  static_assert(kChunk % kTT == 0 && kTT % kBS == 0 && kLPT >= 1 && kLPT <= kWarp, "tile shape");
  static_assert(kRingBytes <= kMaxRingBytes, "ring size");
  static_assert(kBS % kVE == 0 && (kBlkElems * sizeof(CacheT)) % 16 == 0, "tile shape");
};

template <typename T, typename CacheT, int kHead, int kBS, int kG>
__global__ void __launch_bounds__(kThreads, 3)  // 3 blocks an SM: what the ring allows on H100
    paged_attention_staged_kernel(const PagedAttentionProblem p, const Launch l) {
  pdl_wait();  // the dependents are let go after the main loop
  using SS = StagedShape<T, CacheT, kHead, kBS, kG>;
  extern __shared__ uint4 ring_raw[];  // uint4: 16-byte aligned
  CacheT* ring = reinterpret_cast<CacheT*>(ring_raw);
  __shared__ alignas(16) float q_s[kG][kHead];
  __shared__ alignas(16) float score_s[kG][kChunk];
  __shared__ alignas(16) float red_s[kG][kHead];
  __shared__ float run_max[kG], run_sum[kG], alpha_s[kG];

  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int kvh = static_cast<int>(blockIdx.x) / l.num_splits;
  const int split = static_cast<int>(blockIdx.x) % l.num_splits;
  const int head0 = kvh * group + split * kG;
  const int ng = cmin(kG, group - split * kG);  // heads of this block (>= 1)
  const bool xl = p.pos_bias_u != nullptr;
  const CacheT* __restrict__ kc = static_cast<const CacheT*>(p.key_cache);
  const CacheT* __restrict__ vc = static_cast<const CacheT*>(p.value_cache);
  float k_scale = 1.0f, v_scale = 1.0f;
  if constexpr (Shape<T, CacheT, kHead, kBS, kG>::kFp8) {
    k_scale = *p.k_scale;
    v_scale = *p.v_scale;
  }
  // QK mapping: this thread's token within a tile and its first key piece.
  const int qk_tok = warp * SS::kTPW + lane % SS::kTPW;
  const int qk_j = lane / SS::kTPW;
  // PV mapping.
  const int pv_tg = tid / SS::kDThreads;
  const int pv_dl = tid % SS::kDThreads;

  for (int64_t s = blockIdx.z; s < p.num_seqs; s += gridDim.z) {
    const int seq_len = p.seq_lens[s];
    const PartitionRange range = partition_range(l, seq_len);
    if (range.skip) continue;
    const int begin = range.begin, end = range.end;
    const bool direct = range.direct;
    if (seq_len == 0) {  // v1 only (v2's reduce writes the zeros)
      write_zero_heads<T, kHead>(p, s, head0, ng);
      continue;
    }

    const int32_t* __restrict__ table = p.block_tables + s * p.block_table_stride;
    // The producer: the next tile to copy (chunk start, K or V, tile within the chunk) and the
    // ring slot it goes to. Every thread keeps the same state; each copies a share of a tile.
    int pc0 = begin;
    int pkind = 0;  // 0: K, 1: V
    int ptile = 0;
    int pslot = 0;
    auto issue = [&]() {
      if (pc0 < end) {
        const int nb = cdiv(cmin(kChunk, end - pc0), kBS);  // cache blocks of the chunk
        const int b0 = ptile * SS::kTB;
        const int nblk = cmin(SS::kTB, nb - b0);
        const CacheT* src0 = pkind == 0 ? kc : vc;
        CacheT* dst0 = ring + pslot * SS::kTileElems;
        const int first_block = pc0 / kBS;
        // Unrolled, so that the block-table reads of the tile are all issued before the copies
        // that depend on them (one latency, not one per copy).
#pragma unroll
        for (int k = 0; k < SS::kCopyIters; ++k) {
          const int i = tid + k * kThreads;
          if (i < nblk * SS::kBlk16) {
            const int bb = i / SS::kBlk16;
            const int piece = i % SS::kBlk16;
            const int64_t phys = table[first_block + b0 + bb];
            const CacheT* src = src0 + phys * p.kv_block_stride + kvh * p.kv_head_stride;
            stage_copy16(dst0 + bb * SS::kBlkElems + piece * SS::kX, src + piece * SS::kX);
          }
        }
        // Advance: the chunk's K tiles, then its V tiles, then the next chunk.
        if (++ptile * SS::kTB >= nb) {
          ptile = 0;
          if (pkind == 0) {
            pkind = 1;
          } else {
            pkind = 0;
            pc0 += kChunk;
          }
        }
      }
      stage_commit();  // an empty group at the end keeps the wait counts uniform
      pslot = pslot + 1 == SS::kStages ? 0 : pslot + 1;
    };
    int cslot = 0;  // the ring slot of the next tile to compute
    // Waits for the next tile, then refills the slot computed before it.
    auto next_tile = [&]() {
      stage_wait<SS::kStages - 2>();
      __syncthreads();
      issue();
    };

    // q (+ u for XL) of the group's heads, in fp32, times scale (and k_scale for fp8 caches).
    const float qmul = p.scale * k_scale;
    for (int i = tid; i < kG * kHead; i += kThreads) {
      const int g = i / kHead, d = i % kHead;
      const float v = g < ng ? query_value<T>(p, s, head0 + g, d, xl) : 0.0f;
      q_s[g][d] = v * qmul;
    }
    if (tid < kG) {
      run_max[tid] = -INFINITY;
      run_sum[tid] = 0.0f;
    }
    float acc[SS::kDIters][kG];
#pragma unroll
    for (int i = 0; i < SS::kDIters; ++i)
#pragma unroll
      for (int g = 0; g < kG; ++g) acc[i][g] = 0.0f;
    // The prologue: kStages - 1 tiles in flight (the first wait's __syncthreads also publishes q_s
    // and run_*).
#pragma unroll 1
    for (int i = 0; i + 1 < SS::kStages; ++i) issue();

    const float* slopes = p.alibi_slopes;
#pragma unroll 1
    for (int c0 = begin; c0 < end; c0 += kChunk) {
      const int n = cmin(kChunk, end - c0);  // valid tokens of this chunk
      const int nb = cdiv(n, kBS);           // cache blocks it touches
      const int ntile = cdiv(nb, SS::kTB);

      // (1) scores: thread group qk_tok takes token qk_tok of each K tile.
#pragma unroll 1
      for (int tile = 0; tile < ntile; ++tile) {
        next_tile();
        const CacheT* kt = ring + cslot * SS::kTileElems;
        cslot = cslot + 1 == SS::kStages ? 0 : cslot + 1;
        const int t = tile * SS::kTT + qk_tok;  // token within the chunk
        const CacheT* kb = kt + (qk_tok / kBS) * SS::kBlkElems + (qk_tok % kBS) * SS::kX;
        float dot[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) dot[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < SS::kKIters; ++i) {
          const int c = qk_j + SS::kLPT * i;
          if (c < SS::kNC) {
            const Pack<CacheT, SS::kX> kr =
                *reinterpret_cast<const Pack<CacheT, SS::kX>*>(kb + c * kBS * SS::kX);
            float kf[SS::kX];
#pragma unroll
            for (int e = 0; e < SS::kX; ++e) kf[e] = to_float(kr.v[e]);
#pragma unroll
            for (int g = 0; g < kG; ++g) {
              if (g < ng) {
#pragma unroll
                for (int e4 = 0; e4 < SS::kX; e4 += 4) {
                  const float4 qv = *reinterpret_cast<const float4*>(&q_s[g][c * SS::kX + e4]);
                  dot[g] +=
                      qv.x * kf[e4] + qv.y * kf[e4 + 1] + qv.z * kf[e4 + 2] + qv.w * kf[e4 + 3];
                }
              }
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
#pragma unroll
          for (int o = SS::kTPW; o < kWarp; o <<= 1) dot[g] += APHRODITE_SHFL_XOR(dot[g], o);
        }
        if (qk_j == 0 && t < n) {
          const int j = c0 + t;  // token within the sequence
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            if (g < ng) {
              const int64_t h = head0 + g;
              float sc = dot[g];
              if (slopes != nullptr) sc += slopes[h] * static_cast<float>(j - seq_len + 1);
              if (xl) {
                sc += p.scale * to_float(static_cast<const T*>(
                                    p.matrix_bd)[s * p.bd_seq_stride + h * p.bd_head_stride + j]);
              }
              score_s[g][t] = sc;
            }
          }
        }
      }
      __syncthreads();

      // (2) softmax step over this chunk (chunk_softmax).
      chunk_softmax(score_s, run_max, run_sum, alpha_s, ng, n, nb * kBS, warp, lane);
      __syncthreads();

      // (3) acc = acc * alpha + p . v over the V tiles.
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float a = g < ng ? alpha_s[g] : 0.0f;
#pragma unroll
        for (int i = 0; i < SS::kDIters; ++i) acc[i][g] *= a;
      }
#pragma unroll 1
      for (int tile = 0; tile < ntile; ++tile) {
        next_tile();
        const CacheT* vt = ring + cslot * SS::kTileElems;
        cslot = cslot + 1 == SS::kStages ? 0 : cslot + 1;
#pragma unroll 1
        for (int sg = pv_tg; sg < SS::kSegs; sg += SS::kTG) {
          const int tt0 = sg * SS::kVE;         // first token of the segment, in the tile
          const int t0 = tile * SS::kTT + tt0;  // ... in the chunk
          if (t0 >= n) break;  // segments ascend; blocks past the chunk's were never copied
          const CacheT* vb = vt + (tt0 / kBS) * SS::kBlkElems + tt0 % kBS;
          // This thread's value vectors of the segment (one per dimension it owns), in fp32.
          float vf[SS::kDIters][SS::kVE];
#pragma unroll
          for (int i = 0; i < SS::kDIters; ++i) {
            const int d = pv_dl + SS::kDThreads * i;
            Pack<CacheT, SS::kVE> vr{};
            if (d < kHead) vr = *reinterpret_cast<const Pack<CacheT, SS::kVE>*>(vb + d * kBS);
            if (t0 + SS::kVE > n) {
              // The sequence's last, partial block: its unused slots may hold anything (NaN),
              // and p = 0 does not cancel NaN.
#pragma unroll
              for (int e = 0; e < SS::kVE; ++e)
                if (t0 + e >= n) vr.v[e] = CacheT{};
            }
#pragma unroll
            for (int e = 0; e < SS::kVE; ++e) vf[i][e] = to_float(vr.v[e]);
          }
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            if (g < ng) {
#pragma unroll
              for (int e4 = 0; e4 < SS::kVE; e4 += 4) {
                const float4 pv = *reinterpret_cast<const float4*>(&score_s[g][t0 + e4]);
#pragma unroll
                for (int i = 0; i < SS::kDIters; ++i) {
                  acc[i][g] += pv.x * vf[i][e4] + pv.y * vf[i][e4 + 1] + pv.z * vf[i][e4 + 2] +
                               pv.w * vf[i][e4 + 3];
                }
              }
            }
          }
        }
      }
    }
    stage_wait<0>();  // only empty groups remain; nothing may be in flight into the next sequence
    pdl_launch_dependents();  // the main loop is done: the next kernel may take room now

    // Combine the token groups through red_s.
    for (int k = 0; k < SS::kTG; ++k) {
      if (pv_tg == k) {
#pragma unroll
        for (int i = 0; i < SS::kDIters; ++i) {
          const int d = pv_dl + SS::kDThreads * i;
          if (d < kHead) {
#pragma unroll
            for (int g = 0; g < kG; ++g) red_s[g][d] = k == 0 ? acc[i][g] : red_s[g][d] + acc[i][g];
          }
        }
      }
      __syncthreads();
    }

    // Write: out (v1, or a sequence of one partition) or the partition's scratch.
    for (int i = tid; i < ng * kHead; i += kThreads) {
      const int g = i / kHead, d = i % kHead;
      const int64_t h = head0 + g;
      const float total = run_sum[g];
      const float v = total > 0.0f ? red_s[g][d] * v_scale / total : 0.0f;
      store_result<T, kHead>(p, l, s, h, d, v, direct, run_max[g], total);
    }
    __syncthreads();  // q_s, run_*, red_s and the ring are reused by the next sequence
  }
}

}  // namespace detail

}  // namespace aphrodite::attention
