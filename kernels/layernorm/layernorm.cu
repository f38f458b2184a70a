// GPU kernels for RMS normalisation, plain and fused with the residual add (layernorm.h).
// Narrow rows share a block (a power-of-two lane group of at most a warp per row); wide rows get
// a block each. Rows of up to 4096 vectors (rms_norm) or 2048 vectors (fused_add_rms_norm) of 16
// bytes (one element on the scalar path) stay in registers between the sum-of-squares pass and
// the output pass; wider rows are read twice. Plain rms_norm on 4096 rows or more of 513 to 2048
// 16-byte vectors (CUDA) reads each row twice as well, the second time from the caches, which the
// first read asked to keep it (rms_norm_two_pass_kernel). Every thread issues all of its loads
// for a row (for a pass) before it uses any of them, but for that kernel's second pass, which
// goes chunk by chunk. Torch-free.
#include "layernorm/layernorm.h"

#include <cstdint>
#include <type_traits>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace aphrodite::layernorm {
namespace {

/// Block of the kernel that re-reads rows; also its launch bound.
constexpr int kStreamThreads = 512;
/// Vectors per thread and step that the row-re-reading kernel loads before using them.
constexpr int kStreamBatch = 4;
/// Largest block of the kernels that keep rows in registers; also their launch bound.
constexpr int kMaxCachedThreads = 512;
/// Threads per block when several narrow rows share a block.
constexpr int kMultiRowThreads = 256;
/// Wide rows: threads per row are a multiple of this (a whole number of warps on every vendor).
constexpr int kThreadQuantum = 64;
/// Vectors per thread a row-in-registers block of at most 256 threads may hold, tried in order.
constexpr int kCacheSteps[] = {1, 2, 4, 8};
/// Largest register cache (vectors per thread), used with up to 512 threads per row. The fused
/// kernel holds two vectors (input and residual) per cached one and stops at half of it.
constexpr int kMaxCache = 8;
constexpr int kMaxFusedCache = kMaxCache / 2;
/// Plain rms_norm with rows in registers: when one row (group) per block would make more blocks
/// than this, each block takes two and loads the second while it stores the first.
constexpr int64_t kPipelineMinBlocks = 8192;
/// fused_add_rms_norm on at most this many wide rows (decode: fewer rows than an H100 has SMs,
/// so each SM holds at most one of the one-row blocks) spreads a row over twice the threads, up
/// to kMaxCachedThreads, each caching half as many vectors. H100, bf16, hidden 8192, cold L2:
/// 512 threads x 2 vectors against 256 x 4 took 4.86 against 4.99 us at 16 rows and 5.27 against
/// 5.41 at 64 (kernels/layernorm/NOTES.md).
constexpr int64_t kFewRows = 128;
/// Plain rms_norm on at least this many rows of more than kTwoPassThreads and at most
/// kTwoPassThreads * kMaxTwoPassChunks 16-byte vectors takes rms_norm_two_pass_kernel (CUDA).
/// H200, bf16 (same run as the kernel's figures): rows of 8192 at 1024 rows took 11.6 us against
/// the row-in-registers kernel's 10.9, at 4096 rows 32.6 both (the break-even, hence the bound);
/// rows of 4096 (512 vectors, one a thread) 38.3 against 33.1 at 8192 rows. Rows of more than 2048
/// vectors were not measured with it.
constexpr int64_t kTwoPassMinRows = 4096;
constexpr int kTwoPassThreads = 512;
constexpr int kMaxTwoPassChunks = 4;
/// The largest block of any kernel here (row_sum's bound on the warps of a row).
constexpr int kMaxBlockThreads =
    kStreamThreads > kMaxCachedThreads ? kStreamThreads : kMaxCachedThreads;
/// Grid limit; the kernels but rms_norm_two_pass_kernel (one row a block) loop over rows beyond it.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

/// Both problems in one shape. Plain: out/in are the output and input. Fused: out == in is the
/// input tensor (overwritten with the result) and residual is updated in place.
template <typename T>
struct NormArgs {
  T* out;
  const T* in;
  T* residual;
  const T* weight;
  int64_t rows;
  int64_t hidden;
  int64_t out_stride;
  int64_t in_stride;
  int64_t residual_stride;
  float epsilon;
  float inv_hidden;  ///< 1 / hidden: the mean of squares is their sum times it
  int num_vecs;      ///< hidden / kVec of the launched kernel
};

/// v[0] + ... + v[N - 1] added pairwise (a tree of depth log2 N, N a power of two), unrolled.
template <int N>
__device__ __forceinline__ float tree_sum(const float (&v)[N]) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    float h[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) h[i] = v[i] + v[i + N / 2];
    return tree_sum(h);
  }
}

/// The sum of the first num_warps of smem's kMaxWarps slots, as a fixed tree (absent warps count
/// 0): no loop of unknown trip count, and log2(kMaxWarps) dependent adds instead of one a warp.
template <int kMaxWarps>
__device__ __forceinline__ float warps_sum(const float* smem, int num_warps) {
  float w[kMaxWarps];
#pragma unroll
  for (int i = 0; i < kMaxWarps; ++i) w[i] = i < num_warps ? smem[i] : 0.0f;
  return tree_sum(w);
}

/// Sum of `v` over the blockDim.x threads of this thread's row; every one of them gets the same
/// value. Narrow rows (blockDim.x a power of two <= warp size) reduce with shuffles inside their
/// lane group; wide rows (blockDim.y == 1, blockDim.x a multiple of the warp size) go through
/// shared memory. Every thread of the block must call it. `reuse` (a constant): smem is reused
/// afterwards (the next row), so the call ends with a barrier; a kernel that reduces once skips it.
/// `max256`: at most kMultiRowThreads (256) threads a row (a tree of fewer slots).
__device__ __forceinline__ float row_sum(float v, float* smem, bool reuse = true,
                                         bool max256 = false) {
  if (blockDim.x <= APHRODITE_WARP_SIZE) {
    for (int mask = static_cast<int>(blockDim.x) / 2; mask > 0; mask /= 2) {
      v += APHRODITE_SHFL_XOR(v, mask);
    }
    return v;
  }
  for (int mask = APHRODITE_WARP_SIZE / 2; mask > 0; mask /= 2) v += APHRODITE_SHFL_XOR(v, mask);
  const int warp = static_cast<int>(threadIdx.x) / APHRODITE_WARP_SIZE;
  const int lane = static_cast<int>(threadIdx.x) % APHRODITE_WARP_SIZE;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int num_warps = static_cast<int>(blockDim.x) / APHRODITE_WARP_SIZE;
  const float total = max256 ? warps_sum<kMultiRowThreads / APHRODITE_WARP_SIZE>(smem, num_warps)
                             : warps_sum<kMaxBlockThreads / APHRODITE_WARP_SIZE>(smem, num_warps);
  if (reuse) __syncthreads();  // smem is reused by the next row
  return total;
}

/// Sum of the squares of v's elements in two interleaved chains (half the dependent adds of one;
/// a full tree would hold every square at once, and the registers are needed for the row).
template <typename T, int N>
__device__ __forceinline__ float sum_squares(const Vec<T, N>& v) {
  if constexpr (N == 1) {
    return to_float(v.v[0]) * to_float(v.v[0]);
  } else {
    float even = 0.0f, odd = 0.0f;
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      even = fmaf(to_float(v.v[e]), to_float(v.v[e]), even);
      odd = fmaf(to_float(v.v[e + 1]), to_float(v.v[e + 1]), odd);
    }
    return even + odd;
  }
}

/// Sum over the kCache vectors of a row this thread holds (those with in_row(i)), pairwise.
template <typename T, int N, int kCache, typename InRow>
__device__ __forceinline__ float sum_squares(const Vec<T, N> (&v)[kCache], InRow&& in_row) {
  float s[kCache];
#pragma unroll
  for (int i = 0; i < kCache; ++i) s[i] = in_row(i) ? sum_squares(v[i]) : 0.0f;
  return tree_sum(s);
}

/// T(v * inv_rms * w), elementwise in fp32.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> normalise(const Vec<T, N>& v, const Vec<T, N>& w,
                                               float inv_rms) {
  Vec<T, N> y;
#pragma unroll
  for (int e = 0; e < N; ++e) y.v[e] = from_float<T>(to_float(v.v[e]) * inv_rms * to_float(w.v[e]));
  return y;
}

/// Blocks (of up to kMaxCachedThreads) an SM must hold of the one-row rms_norm kernel with up to
/// 4 cached vectors: 64 registers a thread, so that 4 blocks of 256 threads are resident (bf16
/// rows of 8192 at thousands of rows; the compiler's choice is a few registers more, 3 blocks).
constexpr int rms_min_blocks(int cache, bool pipelined) { return !pipelined && cache <= 4 ? 2 : 1; }

/// Plain rms_norm with the row in registers: thread x of a row holds vectors x, x + blockDim.x,
/// ... (kCache of them, which must cover the row). kPipelined: rows are taken row, row + rows of
/// the grid, ..., and software-pipelined: the next row's loads are issued before the current row
/// is normalised and stored. Otherwise each block row takes one row (the grid covers the rows),
/// loads its weights beside it and holds no second buffer: fewer registers, so twice the
/// rows in flight an SM (bf16 rows of 8192: 98 -> 64 registers, 2 -> 4 blocks of 256). The host
/// guarantees that hidden / kVec fits an int. kIdx32 and kFull (non-pipelined only) as for
/// fused_add_rms_norm_cached_kernel.
template <typename T, int kVec, int kCache, bool kPipelined, bool kIdx32 = false,
          bool kFull = false>
__global__ void __launch_bounds__(kMaxCachedThreads, rms_min_blocks(kCache, kPipelined))
    rms_norm_cached_kernel(const NormArgs<T> a) {
  pdl_prologue();
  static_assert(!(kPipelined && (kIdx32 || kFull)), "the pipelined kernel loops over rows");
  using V = Vec<T, kVec>;
  using Index = std::conditional_t<kIdx32, int, int64_t>;
  __shared__ float smem[32];
  const int num_vecs = a.num_vecs;
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const V* w = reinterpret_cast<const V*>(a.weight);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  auto in_row = [&](int i) { return kFull || first + i * tx < num_vecs; };
  auto load_row = [&](int64_t row, V(&dst)[kCache]) {
    if (row < a.rows) {
      const V* x = reinterpret_cast<const V*>(a.in + row * a.in_stride);
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        if (in_row(i)) dst[i] = x[first + i * tx];
      }
    }
  };

  if constexpr (!kPipelined) {
    const Index row = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.y) +
                      static_cast<Index>(threadIdx.y);
    const bool valid = kFull || row < static_cast<Index>(a.rows);
    V x[kCache], wv[kCache];
    const V* in =
        reinterpret_cast<const V*>(a.in + (valid ? row : 0) * static_cast<Index>(a.in_stride));
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (valid && in_row(i)) {
        x[i] = in[first + i * tx];
        wv[i] = w[first + i * tx];
      }
    }
    const float ss = sum_squares<T, kVec, kCache>(x, [&](int i) { return valid && in_row(i); });
    const float inv_rms =
        rsqrtf(row_sum(ss, smem, false, kCache < kMaxCache) * a.inv_hidden + a.epsilon);
    if (!valid) return;
    V* o = reinterpret_cast<V*>(a.out + row * static_cast<Index>(a.out_stride));
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (in_row(i)) {
        launder(x[i]);
        o[first + i * tx] = normalise(x[i], wv[i], inv_rms);
      }
    }
    return;
  }

  // Up to 4 cached vectors a thread holds its weights (the same columns in every row) for the
  // whole kernel, loaded beside the block's first row: a lone row (decode) then waits for
  // memory once. Beyond that the extra registers would cost more than the latency, and each
  // row loads them (from L2) after its reduction.
  constexpr bool kHoldWeights = kCache <= 4;
  V wv[kCache];

  // Normalises and stores `row` from `cur` after issuing the loads of the block's next row into
  // `next`. Uniform across the block: every thread reaches every row_sum.
  auto process = [&](int64_t row, V(&cur)[kCache], V(&next)[kCache]) {
    const bool valid = row < a.rows;
    const float ss = sum_squares<T, kVec, kCache>(cur, [&](int i) { return valid && in_row(i); });
    const float inv_rms = rsqrtf(row_sum(ss, smem) * a.inv_hidden + a.epsilon);
    load_row(row + row_step, next);
    if (valid) {
      V* o = reinterpret_cast<V*>(a.out + row * a.out_stride);
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (c < num_vecs) {
          launder(cur[i]);
          if constexpr (!kHoldWeights) wv[i] = w[c];
          o[c] = normalise(cur[i], wv[i], inv_rms);
        }
      }
    }
  };

  // Rows alternate between two register buffers, so nothing is copied between iterations.
  int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y;
  int64_t row = row0 + threadIdx.y;
  V buf0[kCache];
  V buf1[kCache];
  load_row(row, buf0);
  if constexpr (kHoldWeights) {
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (first + i * tx < num_vecs) wv[i] = w[first + i * tx];
    }
  }
  while (row0 < a.rows) {
    process(row, buf0, buf1);
    row0 += row_step;
    row += row_step;
    if (row0 >= a.rows) break;
    process(row, buf1, buf0);
    row0 += row_step;
    row += row_step;
  }
}

/// Plain rms_norm over many rows, a row a block, read twice: pass 1 loads the row (kChunks vectors
/// a thread, all issued before any is used) asking L1 and L2 to keep the lines (CacheHint::kKeep)
/// and sums the squares; pass 2 re-reads it from the caches as its last use (kLast), with the
/// weights, and stores. Nothing of the row stays in registers across the reduction: on sm_90a 29-32
/// registers at two chunks (four blocks of up to 512 threads an SM), 32-38 at four (three or four).
/// The loop shape and hints are those of torch.compile's kernel for this function; the L2 hint of
/// pass 1 is the part that matters (kernels/layernorm/NOTES.md). Same H200 run against the
/// row-in-registers kernels, us: bf16 8192 x 8192 63.5 against 64.5 (torch.compile 63.3), 16384 x
/// 8192 124.5 against 143.3 (124.5), 8192 x 5120 39.7 against 42.5 (44.3); fp32 8192 x 8192 125.5
/// against 128.1 (126.6). A row is rewritten in place safely: each thread stores only vectors it
/// has read.
template <typename T, int kVec, int kChunks>
__global__ void __launch_bounds__(kTwoPassThreads, kChunks <= 2 ? 4 : 2)
    rms_norm_two_pass_kernel(const NormArgs<T> a) {
  pdl_prologue();
  using V = Vec<T, kVec>;
  __shared__ float smem[32];
  const int num_vecs = a.num_vecs;
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const V* w = reinterpret_cast<const V*>(a.weight);
  auto in_row = [&](int i) { return first + i * tx < num_vecs; };
  const int64_t row = blockIdx.x;  // the grid covers the rows
  const V* x = reinterpret_cast<const V*>(a.in + row * a.in_stride);
  V v[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    v[i] = load_hinted<CacheHint::kKeep>(x + first + i * tx, in_row(i));
  }
  // Vectors past the row were loaded as zeros.
  const float ss = sum_squares<T, kVec, kChunks>(v, [](int) { return true; });
  const float inv_rms = rsqrtf(row_sum(ss, smem, false) * a.inv_hidden + a.epsilon);
  // Pass 2 chunk by chunk, as torch.compile's kernel: loading all of it before the first store
  // (which the later loads could alias) took 48-56 registers at four chunks (two blocks an SM)
  // and lost 0.6-2.5% (H200).
  V* o = reinterpret_cast<V*>(a.out + row * a.out_stride);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = first + i * tx;
    if (in_row(i)) {
      const V wc = w[c];
      o[c] = normalise(load_hinted<CacheHint::kLast>(x + c, true), wc, inv_rms);
    }
  }
}

/// fused_add_rms_norm with the row in registers (same layout as rms_norm_cached_kernel, one row
/// per block row at a time): loads input and residual, stores the rounded sum to the residual,
/// then writes the normalised rounded sum to the input. A thread holds its weights (the same
/// columns in every row) for the whole kernel, loaded before its first row's input and residual,
/// so that a lone row (decode) waits for memory once (issued after the residual's store, which
/// may alias them, the weight loads could not go out before the first loads return).
/// kIdx32: the grid covers the rows (one row a block row, no row loop) and every element offset
/// fits an int (32-bit index arithmetic). kFull (with kIdx32): every thread has a row and all
/// kCache of its vectors lie in it (rows % blockDim.y == 0, hidden / kVec == blockDim.x *
/// kCache), so that nothing is bounds-checked.
template <typename T, int kVec, int kCache, bool kIdx32 = false, bool kFull = false>
__global__ void __launch_bounds__(kMaxCachedThreads)
    fused_add_rms_norm_cached_kernel(const NormArgs<T> a) {
  pdl_prologue();
  static_assert(kIdx32 || !kFull, "kFull needs the grid to cover the rows");
  using V = Vec<T, kVec>;
  using Index = std::conditional_t<kIdx32, int, int64_t>;
  __shared__ float smem[32];
  const int num_vecs = a.num_vecs;
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const V* w = reinterpret_cast<const V*>(a.weight);
  auto in_row = [&](int i) { return kFull || first + i * tx < num_vecs; };
  V wv[kCache];
#pragma unroll
  for (int i = 0; i < kCache; ++i) {
    if (in_row(i)) wv[i] = w[first + i * tx];
  }
  const Index rows = static_cast<Index>(a.rows);
  auto process = [&](Index row) {
    const bool valid = kFull || row < rows;
    const Index r = valid ? row : 0;
    V* x = reinterpret_cast<V*>(a.out + r * static_cast<Index>(a.out_stride));  // overwritten
    V* res = reinterpret_cast<V*>(a.residual + r * static_cast<Index>(a.residual_stride));
    V sum[kCache] = {};
    V other[kCache] = {};
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (valid && in_row(i)) {
        sum[i] = x[first + i * tx];
        other[i] = res[first + i * tx];
      }
    }
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (valid && in_row(i)) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          sum[i].v[e] = from_float<T>(to_float(sum[i].v[e]) + to_float(other[i].v[e]));
        }
        res[first + i * tx] = sum[i];
      }
    }
    const float ss = sum_squares<T, kVec, kCache>(sum, [&](int i) { return valid && in_row(i); });
    const float inv_rms =
        rsqrtf(row_sum(ss, smem, !kIdx32, tx <= kMultiRowThreads) * a.inv_hidden + a.epsilon);
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (valid && in_row(i)) {
        launder(sum[i]);
        x[first + i * tx] = normalise(sum[i], wv[i], inv_rms);
      }
    }
  };
  const Index row = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.y) +
                    static_cast<Index>(threadIdx.y);
  if constexpr (kIdx32) {
    process(row);
  } else {
    // The loop bound is uniform across the block, so every thread reaches every row_sum.
    const Index row_step = static_cast<Index>(gridDim.x) * blockDim.y;
    for (Index row0 = row - threadIdx.y; row0 < rows; row0 += row_step) {
      process(row0 + threadIdx.y);
    }
  }
}

/// Either problem for rows of any width (one row per block): the first pass accumulates the sum
/// of squares (fused: and stores the rounded residual), the second re-reads the row (fused: the
/// residual this thread stored) and writes the output. kStreamBatch vectors per thread are loaded
/// together.
template <typename T, int kVec, bool kFused>
__global__ void __launch_bounds__(kStreamThreads) rms_norm_streaming_kernel(const NormArgs<T> a) {
  pdl_prologue();
  using V = Vec<T, kVec>;
  __shared__ float smem[32];
  const int num_vecs = a.num_vecs;
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const V* w = reinterpret_cast<const V*>(a.weight);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const V* x = reinterpret_cast<const V*>(a.in + row * a.in_stride);
    V* o = reinterpret_cast<V*>(a.out + row * a.out_stride);
    V* res = nullptr;
    if constexpr (kFused) res = reinterpret_cast<V*>(a.residual + row * a.residual_stride);
    float ss = 0.0f;
#pragma unroll 1
    for (int c0 = first; c0 < num_vecs; c0 += kStreamBatch * tx) {
      V v[kStreamBatch] = {};
      V other[kStreamBatch] = {};
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        const int c = c0 + i * tx;
        if (c < num_vecs) {
          v[i] = x[c];
          if constexpr (kFused) other[i] = res[c];
        }
      }
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        const int c = c0 + i * tx;
        if (c < num_vecs) {
          if constexpr (kFused) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              v[i].v[e] = from_float<T>(to_float(v[i].v[e]) + to_float(other[i].v[e]));
            }
            res[c] = v[i];
          }
          ss += sum_squares(v[i]);
        }
      }
    }
    const float inv_rms = rsqrtf(row_sum(ss, smem) * a.inv_hidden + a.epsilon);
    const V* src = x;
    if constexpr (kFused) src = res;
#pragma unroll 1
    for (int c0 = first; c0 < num_vecs; c0 += kStreamBatch * tx) {
      V v[kStreamBatch] = {};
      V wv[kStreamBatch] = {};
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        const int c = c0 + i * tx;
        if (c < num_vecs) {
          v[i] = src[c];
          wv[i] = w[c];
        }
      }
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        const int c = c0 + i * tx;
        if (c < num_vecs) o[c] = normalise(v[i], wv[i], inv_rms);
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Whether every element offset of a's rows (in every tensor the kernel touches) fits an int.
template <typename T>
bool offsets_fit_int(const NormArgs<T>& a) {
  constexpr int64_t kMax = INT32_MAX;
  if (a.rows > kMax) return false;
  const int64_t last = a.rows - 1;
  auto fits = [&](int64_t stride) {
    return stride >= 0 && (last == 0 || stride <= (kMax - a.hidden) / last);
  };
  return fits(a.out_stride) && fits(a.in_stride) && fits(a.residual_stride);
}

/// Launches the row-in-registers kernel K<kIdx32, kFull> (see fused_add_rms_norm_cached_kernel)
/// that fits: 32-bit offsets where the grid covers the rows and every offset fits an int, without
/// bounds checks where the block shape covers the rows exactly.
template <typename T, int kVec, int kCache, bool kFused>
gpuError_t launch_cached_one_row(const NormArgs<T>& a, int64_t blocks, int64_t tx, int64_t ty,
                                 gpuStream_t stream) {
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  const bool idx32 = blocks * ty >= a.rows && offsets_fit_int(a);
  const bool full = idx32 && a.rows % ty == 0 && a.num_vecs == tx * kCache;
  auto launch = [&](auto idx32_tag, auto full_tag) {
    constexpr bool kIdx32 = decltype(idx32_tag)::value, kFull = decltype(full_tag)::value;
    if constexpr (kFused) {
      launch_kernel<fused_add_rms_norm_cached_kernel<T, kVec, kCache, kIdx32, kFull>>(grid, block,
                                                                                      0, stream, a);
    } else {
      launch_kernel<rms_norm_cached_kernel<T, kVec, kCache, false, kIdx32, kFull>>(grid, block, 0,
                                                                                   stream, a);
    }
  };
  if (full) {
    launch(std::true_type{}, std::true_type{});
  } else if (idx32) {
    launch(std::true_type{}, std::false_type{});
  } else {
    launch(std::false_type{}, std::false_type{});
  }
  return gpuGetLastError();
}

template <typename T, int kVec, int kCache, bool kFused>
gpuError_t launch_norm(const NormArgs<T>& a, int64_t tx, int64_t ty, gpuStream_t stream) {
  int64_t blocks = ceil_div(a.rows, ty);
  const bool pipelined = blocks > kPipelineMinBlocks;
  if (kCache > 0 && !kFused && pipelined) blocks = ceil_div(blocks, 2);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  if constexpr (kCache == 0) {
    launch_kernel<rms_norm_streaming_kernel<T, kVec, kFused>>(grid, block, 0, stream, a);
  } else if (kFused || !pipelined) {
    return launch_cached_one_row<T, kVec, kCache, kFused>(a, blocks, tx, ty, stream);
  } else {
    launch_kernel<rms_norm_cached_kernel<T, kVec, kCache, true>>(grid, block, 0, stream, a);
  }
  return gpuGetLastError();
}

/// rms_norm_two_pass_kernel for rows of kTwoPassThreads + 1 to kTwoPassThreads *
/// kMaxTwoPassChunks vectors: two chunks a thread, or four, in as few threads as cover the row.
template <typename T, int kVec>
gpuError_t launch_two_pass(const NormArgs<T>& a, gpuStream_t stream) {
  const int chunks = a.num_vecs <= 2 * kTwoPassThreads ? 2 : kMaxTwoPassChunks;
  const int64_t tx =
      ceil_div(ceil_div(int64_t{a.num_vecs}, chunks), kThreadQuantum) * kThreadQuantum;
  const dim3 grid(static_cast<unsigned>(a.rows));
  const dim3 block(static_cast<unsigned>(tx));
  if (chunks == 2) {
    launch_kernel<rms_norm_two_pass_kernel<T, kVec, 2>>(grid, block, 0, stream, a);
  } else {
    launch_kernel<rms_norm_two_pass_kernel<T, kVec, kMaxTwoPassChunks>>(grid, block, 0, stream, a);
  }
  return gpuGetLastError();
}

/// Picks the block shape and register cache for rows of hidden / kVec vectors and launches.
template <typename T, int kVec, bool kFused>
gpuError_t launch_shaped(NormArgs<T> a, gpuStream_t stream) {
  const int64_t num_vecs = a.hidden / kVec;
  a.num_vecs = static_cast<int>(num_vecs);
  a.inv_hidden = 1.0f / static_cast<float>(a.hidden);
#if !defined(USE_ROCM)
  if constexpr (!kFused && kVec * sizeof(T) == 16) {
    if (a.rows >= kTwoPassMinRows && a.rows <= INT32_MAX && num_vecs > kTwoPassThreads &&
        num_vecs <= int64_t{kTwoPassThreads} * kMaxTwoPassChunks) {
      return launch_two_pass<T, kVec>(a, stream);
    }
  }
#endif
  int64_t tx = 1;
  int64_t ty = 1;
  int cache = 0;
  if (num_vecs <= 32) {
    // Narrow rows: a power-of-two lane group per row, several rows per block.
    while (tx < num_vecs) tx *= 2;
    ty = kMultiRowThreads / tx;
    cache = 1;
  } else {
    const int max_cache = kFused ? kMaxFusedCache : kMaxCache;
    for (int c : kCacheSteps) {
      if (c <= max_cache && num_vecs <= int64_t{kMultiRowThreads} * c) {
        cache = c;
        break;
      }
    }
    if (cache == 0 && num_vecs <= int64_t{kMaxCachedThreads} * max_cache) cache = max_cache;
    if (kFused && a.rows <= kFewRows) {
      while (cache > 1 && num_vecs <= int64_t{kMaxCachedThreads} * (cache / 2)) cache /= 2;
    }
    if (cache > 0) {
      tx = ceil_div(ceil_div(num_vecs, cache), kThreadQuantum) * kThreadQuantum;
    } else {
      tx = kStreamThreads;
    }
  }
  switch (cache) {
    case 1: return launch_norm<T, kVec, 1, kFused>(a, tx, ty, stream);
    case 2: return launch_norm<T, kVec, 2, kFused>(a, tx, ty, stream);
    case 4: return launch_norm<T, kVec, 4, kFused>(a, tx, ty, stream);
    case 8:
      if constexpr (!kFused) return launch_norm<T, kVec, 8, kFused>(a, tx, ty, stream);
      return gpuErrorInvalidValue;  // unreachable: the fused kernels cache at most 4 vectors
    default: return launch_norm<T, kVec, 0, kFused>(a, tx, ty, stream);
  }
}

/// Takes the 16-byte path when the row width, every stride and every pointer allow it.
template <typename T, bool kFused>
gpuError_t launch_typed(const NormArgs<T>& a, gpuStream_t stream) {
  if (a.rows <= 0 || a.hidden <= 0) return gpuSuccess;
  if (a.hidden > INT32_MAX) return gpuErrorInvalidValue;
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  bool vectorised = a.hidden % kVec == 0 && a.out_stride % kVec == 0 && a.in_stride % kVec == 0 &&
                    aligned16(a.out) && aligned16(a.in) && aligned16(a.weight);
  if (kFused) vectorised = vectorised && a.residual_stride % kVec == 0 && aligned16(a.residual);
  if (vectorised) return launch_shaped<T, kVec, kFused>(a, stream);
  return launch_shaped<T, 1, kFused>(a, stream);
}

template <typename T>
gpuError_t run_rms_norm(const RmsNormProblem& p, gpuStream_t stream) {
  NormArgs<T> a;
  a.out = static_cast<T*>(p.out);
  a.in = static_cast<const T*>(p.input);
  a.residual = nullptr;
  a.weight = static_cast<const T*>(p.weight);
  a.rows = p.num_tokens;
  a.hidden = p.hidden;
  a.out_stride = p.out_row_stride;
  a.in_stride = p.input_row_stride;
  a.residual_stride = 0;
  a.epsilon = p.epsilon;
  return launch_typed<T, false>(a, stream);
}

template <typename T>
gpuError_t run_fused_add_rms_norm(const FusedAddRmsNormProblem& p, gpuStream_t stream) {
  NormArgs<T> a;
  a.out = static_cast<T*>(p.input);
  a.in = static_cast<const T*>(p.input);
  a.residual = static_cast<T*>(p.residual);
  a.weight = static_cast<const T*>(p.weight);
  a.rows = p.num_tokens;
  a.hidden = p.hidden;
  a.out_stride = p.input_row_stride;
  a.in_stride = p.input_row_stride;
  a.residual_stride = p.residual_row_stride;
  a.epsilon = p.epsilon;
  return launch_typed<T, true>(a, stream);
}

}  // namespace

/// @brief Launches out = input * rsqrt(mean(input^2) + epsilon) * weight (fp32 math, one
/// rounding) on `stream` for the element type p.dtype. Returns the launch's error code.
gpuError_t launch_rms_norm(const RmsNormProblem& p, gpuStream_t stream) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return run_rms_norm<float>(p, stream);
    case ScalarType::kFloat16: return run_rms_norm<__half>(p, stream);
    case ScalarType::kBFloat16: return run_rms_norm<__nv_bfloat16>(p, stream);
  }
  return gpuErrorInvalidValue;
}

/// @brief Launches residual = T(input + residual), input = rms_norm(residual) * weight on
/// `stream` for the element type p.dtype; the norm uses the rounded residual. Returns the
/// launch's error code.
gpuError_t launch_fused_add_rms_norm(const FusedAddRmsNormProblem& p, gpuStream_t stream) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return run_fused_add_rms_norm<float>(p, stream);
    case ScalarType::kFloat16: return run_fused_add_rms_norm<__half>(p, stream);
    case ScalarType::kBFloat16: return run_fused_add_rms_norm<__nv_bfloat16>(p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace aphrodite::layernorm
