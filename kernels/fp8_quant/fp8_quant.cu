// GPU kernels of FP8 E4M3 quantization (fp8_quant.h). Every element is stored as
// fp8::from_float(x / scale), the quotient as the fp32 division gives it (Divisor: x times the
// reciprocal, corrected once by fma; not a plain multiplication by 1 / scale), so that the bytes
// equal those of the plain-torch reference `(x.float() / scale).clamp(-448, 448).to(e4m3)`.
//
// - Static and dynamic per-tensor quantization are elementwise over tiles of kUnroll vectors per
//   thread (16-byte loads, 4- or 8-byte fp8 stores); rows that are contiguous with each other are
//   treated as one long row. Static: one tile a block, whose loads issue before the scale is
//   read; at decode sizes a single (merged) row of fewer than 2^31 elements takes a kernel with
//   one load a thread (8 bytes for 16-bit inputs), no row division and 32-bit offsets. Dynamic
//   per-tensor runs two kernels (per-block maxima into a workspace, then a quantization pass
//   whose blocks each reduce those maxima to the scale) on one wave of resident blocks; an input
//   that is one row of up to 4096 vectors takes the per-token register-cached kernel (one block,
//   one read), other small ones a single-block kernel. The workspace rather than an atomicMax on
//   the scale's bits: nothing needs zeroing first (no memset launch, no reliance on the caller's
//   scale), and the result does not depend on order.
// - Per token: rows of up to 4096 vectors stay in registers between the max reduction and the
//   quantization (one read of the input); wider rows are read twice.
// A row whose pointer or stride does not allow 16-byte vectors takes the one-element path.
// NaN inputs do not take part in the maxima (fmaxf) and are stored as NaN. Torch-free; CUDA only
// (common/fp8.h has no HIP conversion yet).
#include "fp8_quant/fp8_quant.h"

#include <cstdint>
#include <type_traits>

#include "common/fast_div.h"
#include "common/fp8.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/per_device.h"
#include "common/vec.cuh"

namespace aphrodite::fp8_quant {
namespace {

/// Block of the elementwise kernels (static, and both dynamic per-tensor passes).
constexpr int kThreads = 256;
/// Vectors per thread and tile that the elementwise kernels load before using any of them.
constexpr int kUnroll = 4;
/// Block of the single-kernel dynamic per-tensor path, taken for inputs of at most
/// kSmallTiles tiles of kSmallThreads * kUnroll vectors: one launch instead of two, and its
/// second read of the input hits L1.
constexpr int kSmallThreads = 1024;
constexpr int64_t kSmallTiles = 2;
/// Per token: a block has at most kRowBlockThreads threads when it holds rows of up to
/// kRowBlockThreads * 8 vectors, and up to kMaxRowThreads threads for one wider row.
constexpr int kRowBlockThreads = 256;
constexpr int kMaxRowThreads = 512;
/// Vectors per thread a per-token block may keep in registers, tried in order.
constexpr int kCacheSteps[] = {1, 2, 4, 8};
constexpr int kMaxCache = 8;
/// Vectors per thread loaded together by the per-token kernel that reads rows twice.
constexpr int kStreamBatch = 4;
/// Most per-block maxima the two-kernel dynamic path writes (its reduction grid's limit).
constexpr int64_t kMaxPartials = 1024;
/// Grid limit of the per-token kernels; they loop over rows beyond it.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

template <typename T, int N>
__device__ __forceinline__ float absmax(const Vec<T, N>& v) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < N; ++e) m = fmaxf(m, fabsf(to_float(v.v[e])));
  return m;
}

/// x / s for many x and one s: q = x * r with r ~ 1 / s, then one correction step on the
/// remainder x - q * s (exact, by fma). That gives the correctly rounded fp32 quotient but in
/// rare cases (a last-bit difference, far below the E4M3 step), at two FMAs and a multiply a
/// value. Nothing here branches on the scale's value (the reciprocal is the hardware's estimate
/// refined by one Newton step), so that the loads of the elements, issued before, are not held
/// back until the scale arrives. Scales whose reciprocal is 0, infinite or NaN divide as
/// written (`plain`, uniform over the launch; callers branch on it once per vector); a quotient
/// keeps the sign of x * r (a zero's sign, which the correction would lose), and one that
/// overflows or is NaN stays as x * r (the conversion saturates it or keeps the NaN).
struct Divisor {
  float s;
  float r;
  bool plain;
  __device__ explicit Divisor(float scale) : s(scale) {
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(scale));
    r = fmaf(fmaf(-scale, r0, 1.0f), r0, r0);
    plain = !(fabsf(r) <= 3.0e38f && fabsf(r) >= 1.0e-37f);
  }
  template <bool kPlain>
  __device__ __forceinline__ float divide(float x) const {
    if constexpr (kPlain) return x / s;
    const float q = x * r;
    const float c = copysignf(fmaf(fmaf(-q, s, x), r, q), q);
    return fabsf(q) <= 3.0e38f ? c : q;
  }
  __device__ __forceinline__ float divide(float x) const {
    return plain ? divide<true>(x) : divide<false>(x);
  }
};

__device__ __forceinline__ uint8_t quantize(float x, const Divisor& scale) {
  return fp8::from_float(scale.divide(x));
}

/// Stores the N elements of v as E4M3 at dst (N-byte aligned) with one N-byte store.
template <typename T, int N>
__device__ __forceinline__ void store_quantized(uint8_t* dst, const Vec<T, N>& v,
                                                const Divisor& scale) {
  static_assert(N == 1 || N == 4 || N == 8, "fp8 stores are of 1, 4 or 8 bytes");
  if constexpr (N == 1) {
    *dst = quantize(to_float(v.v[0]), scale);
  } else {
    // Pairs of elements convert together (fp8::from_float2), two pairs make a word.
    uint32_t w[N / 4];
    auto convert = [&](auto plain) {
      constexpr bool kPlain = decltype(plain)::value;
      auto pair = [&](int e) {
        return static_cast<uint32_t>(fp8::from_float2(scale.divide<kPlain>(to_float(v.v[e])),
                                                      scale.divide<kPlain>(to_float(v.v[e + 1]))));
      };
#pragma unroll
      for (int i = 0; i < N / 4; ++i) w[i] = pair(4 * i) | (pair(4 * i + 2) << 16);
    };
    if (scale.plain) {
      convert(std::true_type{});
    } else {
      convert(std::false_type{});
    }
    if constexpr (N == 4) {
      *reinterpret_cast<uint32_t*>(dst) = w[0];
    } else {
      *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    }
  }
}

/// Max of v over the warp.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int mask = APHRODITE_WARP_SIZE / 2; mask > 0; mask /= 2) {
    v = fmaxf(v, APHRODITE_SHFL_XOR(v, mask));
  }
  return v;
}

/// Max of v over a 1-D block of kBlock threads; every thread gets it. smem: kBlock / warp
/// floats. Every thread of the block must call it, and at most once per kernel (smem is not
/// released for reuse).
template <int kBlock>
__device__ __forceinline__ float block_max(float v, float* smem) {
  constexpr int kWarps = kBlock / APHRODITE_WARP_SIZE;
  v = warp_max(v);
  if constexpr (kWarps == 1) return v;
  const int lane = static_cast<int>(threadIdx.x % APHRODITE_WARP_SIZE);
  if (lane == 0) smem[threadIdx.x / APHRODITE_WARP_SIZE] = v;
  __syncthreads();
  // Every warp reduces the warps' maxima at once: one shared load and a warp reduction.
  return warp_max(lane < kWarps ? smem[lane] : 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Elementwise (static and dynamic per-tensor)
// ---------------------------------------------------------------------------------------------

/// Rows of `vecs_per_row` vectors of kVec elements plus `tail` single elements, cut into tiles
/// of kBlock * kUnroll vectors; a row's last tile also takes its tail elements.
template <typename T>
struct Tiles {
  uint8_t* out;
  const T* in;
  float* scale;
  float* partials;  ///< dynamic: one max per block of the reduction pass
  int64_t out_stride;
  int64_t in_stride;
  int64_t vecs_per_row;
  int tail;  ///< < kVec
  int num_partials;
  uint32_t tiles_per_row;  ///< >= 1
  uint32_t num_tiles;      ///< rows * tiles_per_row, < 2^31
  FastDiv row_of;          ///< tile / tiles_per_row
};

/// This thread's kU vectors of one tile (of kBlock * kU vectors), loaded.
template <typename T, int kVec, int kU>
struct TileLoad {
  Vec<T, kVec> v[kU];
  uint32_t row;
  uint32_t t;  ///< the tile's index in its row
  int64_t c0;  ///< the first vector's index in the row
};

/// Issues this thread's kU loads of `tile`.
template <typename T, int kVec, int kBlock, int kU>
__device__ __forceinline__ TileLoad<T, kVec, kU> load_tile(const Tiles<T>& a, uint32_t tile) {
  using V = Vec<T, kVec>;
  TileLoad<T, kVec, kU> l;
  l.row = a.row_of.div(tile);
  l.t = tile - l.row * a.tiles_per_row;
  const V* xv = reinterpret_cast<const V*>(a.in + static_cast<int64_t>(l.row) * a.in_stride);
  l.c0 = static_cast<int64_t>(l.t) * (kBlock * kU) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (l.c0 + u * kBlock < a.vecs_per_row) l.v[u] = xv[l.c0 + u * kBlock];
  }
  return l;
}

/// Calls vec(row, c, v) for the vectors v (index c in the row) of a loaded tile, and
/// tail(row, e, x) for this thread's tail element if the tile ends its row.
template <typename T, int kVec, int kBlock, int kU, typename VecFn, typename TailFn>
__device__ __forceinline__ void use_tile(const Tiles<T>& a, const TileLoad<T, kVec, kU>& l,
                                         VecFn&& vec, TailFn&& tail) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t c = l.c0 + u * kBlock;
    if (c < a.vecs_per_row) vec(l.row, c, l.v[u]);
  }
  if (l.t == a.tiles_per_row - 1 && static_cast<int>(threadIdx.x) < a.tail) {
    const int64_t e = a.vecs_per_row * kVec + threadIdx.x;
    tail(l.row, e, to_float(a.in[static_cast<int64_t>(l.row) * a.in_stride + e]));
  }
}

/// load_tile and use_tile over the tiles first, first + step, ... of a.
template <typename T, int kVec, int kBlock, int kU, typename VecFn, typename TailFn>
__device__ __forceinline__ void for_each_tile(const Tiles<T>& a, uint32_t first, uint32_t step,
                                              VecFn&& vec, TailFn&& tail) {
  for (uint32_t tile = first; tile < a.num_tiles; tile += step) {
    use_tile<T, kVec, kBlock, kU>(a, load_tile<T, kVec, kBlock, kU>(a, tile), vec, tail);
  }
}

/// Max |x| over the tiles first, first + step, ... of a (this thread's part of them).
template <typename T, int kVec, int kBlock>
__device__ __forceinline__ float tiles_absmax(const Tiles<T>& a, uint32_t first, uint32_t step) {
  float m = 0.0f;
  for_each_tile<T, kVec, kBlock, kUnroll>(
      a, first, step, [&](uint32_t, int64_t, const Vec<T, kVec>& v) { m = fmaxf(m, absmax(v)); },
      [&](uint32_t, int64_t, float x) { m = fmaxf(m, fabsf(x)); });
  return m;
}

/// The quantizing vec and tail callbacks of use_tile: out = e4m3(in / scale).
template <typename T, int kVec>
struct QuantizeFns {
  const Tiles<T>& a;
  const Divisor& div;
  __device__ uint8_t* out_row(uint32_t row) const {
    return a.out + static_cast<int64_t>(row) * a.out_stride;
  }
  __device__ void operator()(uint32_t row, int64_t c, const Vec<T, kVec>& v) const {
    store_quantized(out_row(row) + c * kVec, v, div);
  }
  __device__ void operator()(uint32_t row, int64_t e, float x) const {
    out_row(row)[e] = quantize(x, div);
  }
};

/// out = e4m3(in / scale) over the tiles first, first + step, ... of a.
template <typename T, int kVec, int kBlock, int kU = kUnroll>
__device__ __forceinline__ void tiles_quantize(const Tiles<T>& a, const Divisor& div,
                                               uint32_t first, uint32_t step) {
  const QuantizeFns<T, kVec> fns{a, div};
  for_each_tile<T, kVec, kBlock, kU>(a, first, step, fns, fns);
}

/// One tile a block (the launch's grid is a.num_tiles): the tile's loads are issued before the
/// scale is read, so that neither waits for the other. The given scale is used as it is: a zero
/// scale gives +-448 (and NaN for 0 / 0), as the reference's division does.
template <typename T, int kVec, int kU, int kBlock = kThreads>
__global__ void __launch_bounds__(kBlock) static_quant_kernel(const Tiles<T> a) {
  pdl_prologue();
  const auto l = load_tile<T, kVec, kBlock, kU>(a, blockIdx.x);
  const Divisor div(*a.scale);
  const QuantizeFns<T, kVec> fns{a, div};
  use_tile<T, kVec, kBlock, kU>(a, l, fns, fns);
}

/// static_quant_kernel for one row (gapless rows merged) of fewer than 2^31 elements and one
/// vector a thread (kU = 1): the block's index is the tile's, so nothing divides, and every
/// offset is a 32-bit int. kTail: the row has tail elements, which the last block takes.
template <typename T, int kVec, int kBlock, bool kTail>
__global__ void __launch_bounds__(kBlock) static_quant_row_kernel(const Tiles<T> a) {
  pdl_prologue();
  using V = Vec<T, kVec>;
  const int vecs = static_cast<int>(a.vecs_per_row);
  const int c = static_cast<int>(blockIdx.x) * kBlock + static_cast<int>(threadIdx.x);
  V v;
  if (c < vecs) v = reinterpret_cast<const V*>(a.in)[c];
  const int e = vecs * kVec + static_cast<int>(threadIdx.x);
  const bool tail = kTail && blockIdx.x == gridDim.x - 1 && static_cast<int>(threadIdx.x) < a.tail;
  const float x = tail ? to_float(a.in[e]) : 0.0f;
  const Divisor div(*a.scale);
  if (c < vecs) store_quantized(a.out + c * kVec, v, div);
  if (tail) a.out[e] = quantize(x, div);
}

/// The per-tensor scale of a max: max / 448; 0 for an all-zero input.
__device__ __forceinline__ float tensor_scale(float amax) { return amax / kFp8Max; }

/// What the elements are divided by: the scale, or 1 where it is 0 (all-zero input, whose
/// elements then quantize to (signed) zeros instead of 0 / 0 = NaN).
__device__ __forceinline__ float safe_divisor(float scale) { return scale > 0.0f ? scale : 1.0f; }

/// Dynamic per-tensor, pass 1: each block's max |x| into partials[blockIdx.x].
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) absmax_partials_kernel(const Tiles<T> a) {
  pdl_prologue();
  __shared__ float smem[kThreads / APHRODITE_WARP_SIZE];
  const float m =
      block_max<kThreads>(tiles_absmax<T, kVec, kThreads>(a, blockIdx.x, gridDim.x), smem);
  if (threadIdx.x == 0) a.partials[blockIdx.x] = m;
}

/// Dynamic per-tensor, pass 2: every block reduces the partial maxima to the scale (block 0
/// stores it), then quantizes its tiles with it.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) dynamic_quant_kernel(const Tiles<T> a) {
  pdl_prologue();
  __shared__ float smem[kThreads / APHRODITE_WARP_SIZE];
  float m = 0.0f;
  for (int i = threadIdx.x; i < a.num_partials; i += kThreads) m = fmaxf(m, a.partials[i]);
  const float scale = tensor_scale(block_max<kThreads>(m, smem));
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale = scale;
  tiles_quantize<T, kVec, kThreads>(a, Divisor(safe_divisor(scale)), blockIdx.x, gridDim.x);
}

/// Dynamic per-tensor in one block: the max, the scale, then the quantization.
template <typename T, int kVec>
__global__ void __launch_bounds__(kSmallThreads) dynamic_quant_small_kernel(const Tiles<T> a) {
  pdl_prologue();
  __shared__ float smem[kSmallThreads / APHRODITE_WARP_SIZE];
  const float scale =
      tensor_scale(block_max<kSmallThreads>(tiles_absmax<T, kVec, kSmallThreads>(a, 0, 1), smem));
  if (threadIdx.x == 0) *a.scale = scale;
  tiles_quantize<T, kVec, kSmallThreads>(a, Divisor(safe_divisor(scale)), 0, 1);
}

// ---------------------------------------------------------------------------------------------
// Per token
// ---------------------------------------------------------------------------------------------

template <typename T>
struct Rows {
  uint8_t* out;
  const T* in;
  float* scale;           ///< [rows]
  const float* scale_ub;  ///< [1] or null
  int64_t rows;
  int64_t out_stride;
  int64_t in_stride;
  int vecs_per_row;
  int tail;  ///< < kVec single elements after the vectors of a row
};

/// Max of v over the blockDim.x threads of this thread's row (threadIdx.y); blockDim.x is a
/// multiple of the warp size and the block has at most kMaxRowThreads threads. Every thread of
/// the block must call it.
__device__ __forceinline__ float row_max(float v, float* smem) {
  v = warp_max(v);
  if (blockDim.x == APHRODITE_WARP_SIZE) return v;
  const int warps = static_cast<int>(blockDim.x) / APHRODITE_WARP_SIZE;
  const int lane = static_cast<int>(threadIdx.x % APHRODITE_WARP_SIZE);
  float* row_smem = smem + threadIdx.y * warps;
  if (lane == 0) row_smem[threadIdx.x / APHRODITE_WARP_SIZE] = v;
  __syncthreads();
  // Every warp of the row reduces the row's warp maxima at once.
  const float m = warp_max(lane < warps ? row_smem[lane] : 0.0f);
  __syncthreads();  // smem is reused by the next row
  return m;
}

/// vLLM's per-token scale: max(min(max|x|, ub) / 448, 1 / (448 * 512)); ub is +inf where the
/// caller gave no bound.
__device__ __forceinline__ float token_scale(float amax, float ub) {
  return fmaxf(fminf(amax, ub) / kFp8Max, kMinPerTokenScale);
}

/// The upper bound of the per-token maxima, read before the rows (it is needed only after their
/// reduction): +inf without one.
__device__ __forceinline__ float load_scale_ub(const float* scale_ub) {
  return scale_ub != nullptr ? *scale_ub : __int_as_float(0x7f800000);
}

/// Rows in registers: thread x of a row holds its vectors x, x + blockDim.x, ... (kCache of
/// them, which cover the row) and, for x < tail, one tail element; blockDim.y rows per block.
/// kPerTensor: the dynamic per-tensor quantization of an input that is one row (one block): the
/// scale is max / 448 and an all-zero row divides by 1, as in the tiled kernels.
template <typename T, int kVec, int kCache, bool kPerTensor = false>
__global__ void __launch_bounds__(kMaxRowThreads) per_token_cached_kernel(const Rows<T> a) {
  pdl_prologue();
  using V = Vec<T, kVec>;
  __shared__ float smem[kMaxRowThreads / APHRODITE_WARP_SIZE];
  const float ub = kPerTensor ? 0.0f : load_scale_ub(a.scale_ub);
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  // The loop bound is uniform across the block, so every thread reaches every row_max.
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < a.rows;
       row0 += row_step) {
    const int64_t row = row0 + threadIdx.y;
    const bool valid = row < a.rows;
    const T* x = a.in + (valid ? row : 0) * a.in_stride;
    const V* xv = reinterpret_cast<const V*>(x);
    V v[kCache];
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int c = first + i * tx;
      if (valid && c < a.vecs_per_row) v[i] = xv[c];
    }
    const bool has_tail = valid && first < a.tail;
    const int64_t tail_at = static_cast<int64_t>(a.vecs_per_row) * kVec + first;
    const float tail_x = has_tail ? to_float(x[tail_at]) : 0.0f;
    float m = fabsf(tail_x);
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      if (valid && first + i * tx < a.vecs_per_row) m = fmaxf(m, absmax(v[i]));
    }
    const float amax = row_max(m, smem);
    const float scale = kPerTensor ? tensor_scale(amax) : token_scale(amax, ub);
    const Divisor div(kPerTensor ? safe_divisor(scale) : scale);
    if (valid) {
      if (first == 0) a.scale[row] = scale;
      uint8_t* o = a.out + row * a.out_stride;
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (c < a.vecs_per_row) {
          launder(v[i]);
          store_quantized(o + static_cast<int64_t>(c) * kVec, v[i], div);
        }
      }
      if (has_tail) o[tail_at] = quantize(tail_x, div);
    }
  }
}

/// Rows of any width, one per block (blockDim.y == 1): the first pass finds the max, the second
/// re-reads the row and quantizes it. kStreamBatch vectors per thread are loaded together.
template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) per_token_streaming_kernel(const Rows<T> a) {
  pdl_prologue();
  using V = Vec<T, kVec>;
  __shared__ float smem[kMaxRowThreads / APHRODITE_WARP_SIZE];
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const float ub = load_scale_ub(a.scale_ub);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = a.in + row * a.in_stride;
    uint8_t* o = a.out + row * a.out_stride;
    const V* xv = reinterpret_cast<const V*>(x);
    const int64_t tail_at = static_cast<int64_t>(a.vecs_per_row) * kVec + first;
    float m = first < a.tail ? fabsf(to_float(x[tail_at])) : 0.0f;
#pragma unroll 1
    for (int c0 = first; c0 < a.vecs_per_row; c0 += kStreamBatch * tx) {
      V v[kStreamBatch];
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        if (c0 + i * tx < a.vecs_per_row) v[i] = xv[c0 + i * tx];
      }
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        if (c0 + i * tx < a.vecs_per_row) m = fmaxf(m, absmax(v[i]));
      }
    }
    const float scale = token_scale(row_max(m, smem), ub);
    const Divisor div(scale);
    if (first == 0) a.scale[row] = scale;
#pragma unroll 1
    for (int c0 = first; c0 < a.vecs_per_row; c0 += kStreamBatch * tx) {
      V v[kStreamBatch];
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        if (c0 + i * tx < a.vecs_per_row) v[i] = xv[c0 + i * tx];
      }
#pragma unroll
      for (int i = 0; i < kStreamBatch; ++i) {
        const int c = c0 + i * tx;
        if (c < a.vecs_per_row) store_quantized(o + static_cast<int64_t>(c) * kVec, v[i], div);
      }
    }
    if (first < a.tail) o[tail_at] = quantize(to_float(x[tail_at]), div);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// SMs of the current device (launch.cuh), or a common count where the runtime cannot say.
int64_t num_sms() {
  constexpr int kFallback = 132;
  const int n = sm_count();
  return n > 0 ? n : kFallback;
}

/// Blocks of `kernel` with `threads` threads that an SM of the current device holds at once,
/// looked up once per device and call site (`cache`), so that the elementwise grids are one wave
/// of resident blocks.
template <typename Kernel>
int64_t resident_blocks(PerDevice& cache, Kernel kernel, int threads) {
  // Where the runtime cannot say: a quarter of an SM's threads per block.
  const int fallback = 2048 / threads / 4 > 0 ? 2048 / threads / 4 : 1;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // not this launch's error
    return fallback;
  }
  const int blocks = cache.get(device, [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess ||
        n <= 0) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  });
  return blocks > 0 ? blocks : fallback;
}

/// The rows of p as tiles of kBlock * kU vectors of kVec elements. Rows that follow each
/// other without a gap (in input and output) become one row. False where the tile count
/// overflows.
template <typename T, int kVec, int kBlock, int kU = kUnroll>
bool make_tiles(const QuantProblem& p, Tiles<T>& a) {
  int64_t rows = p.num_tokens;
  int64_t cols = p.hidden;
  if (rows > 1 && p.input_row_stride == cols && p.out_row_stride == cols) {
    cols *= rows;
    rows = 1;
  }
  a.out = p.out;
  a.in = static_cast<const T*>(p.input);
  a.scale = p.scale;
  a.partials = p.workspace;
  a.out_stride = p.out_row_stride;
  a.in_stride = p.input_row_stride;
  a.vecs_per_row = cols / kVec;
  a.tail = static_cast<int>(cols % kVec);
  a.num_partials = 0;
  const int64_t tiles_per_row =
      a.vecs_per_row > 0 ? ceil_div(a.vecs_per_row, int64_t{kBlock} * kU) : 1;
  const int64_t num_tiles = rows * tiles_per_row;
  if (num_tiles > INT32_MAX) return false;
  a.tiles_per_row = static_cast<uint32_t>(tiles_per_row);
  a.num_tiles = static_cast<uint32_t>(num_tiles);
  a.row_of = FastDiv(a.tiles_per_row);
  return true;
}

/// Whether every row of p starts 16-byte aligned in the input and kVec-byte aligned in the
/// output. `merges_rows`: the kernel treats gapless rows as one (make_tiles), which then only
/// needs its pointers aligned.
template <int kVec>
bool rows_vectorisable(const QuantProblem& p, bool merges_rows) {
  const bool one_row = p.num_tokens <= 1 || (merges_rows && p.input_row_stride == p.hidden &&
                                             p.out_row_stride == p.hidden);
  return aligned(p.input, 16) && aligned(p.out, kVec) &&
         (one_row || (p.input_row_stride % kVec == 0 && p.out_row_stride % kVec == 0));
}

int64_t grid_for(uint32_t num_tiles, int64_t cap) {
  return static_cast<int64_t>(num_tiles) < cap ? static_cast<int64_t>(num_tiles) : cap;
}

template <typename T, int kVec>
gpuError_t launch_static_vec(const QuantProblem& p, gpuStream_t stream) {
  Tiles<T> a;
  if (!make_tiles<T, kVec, kThreads>(p, a)) return gpuErrorInvalidValue;
  // One tile a block (no grid-stride loop): on an H100 the persistent grid ran 8192 x 8192
  // bf16 at 0.93x of torch.compile's one-tile-a-program kernel.
  if (a.num_tiles == 0) return gpuSuccess;
  if (a.num_tiles < num_sms()) {
    // Fewer tiles than SMs (decode sizes): one load a thread (no unrolled tile; half a vector
    // for 16-bit inputs) in blocks of kDecodeBlock threads, so that the work spreads over eight
    // times the threads (four for fp32). H200, bf16 x 8192, calls replayed back to back from a
    // CUDA graph (2026-11-28, us, 1 / 16 / 64 tokens): 1.30 / 1.35 / 1.57 against 1.31 / 1.46 /
    // 1.60 for whole vectors in blocks of 128 (the rule before; torch.compile 1.24 / 1.36 /
    // 1.73); whole vectors in blocks of 256 1.34 / 1.37 / 1.59, half vectors in blocks of 128
    // 1.29 / 1.44 / 1.73. On an H100 (bench_kernels at efe8cea) 0.98 / 0.98 / 1.02x of
    // torch.compile so (1.00 / 1.02 / 1.04x by events), where half vectors in blocks of 128 had
    // run 64 tokens at 0.96-0.99x by events (2026-11-26).
    constexpr int kDecodeBlock = 512;
    // fp32 keeps whole vectors: half of one would need 2-byte fp8 stores, which
    // store_quantized does not make.
    constexpr int kDecodeVec = kVec == 8 ? 4 : kVec;
    if (!make_tiles<T, kDecodeVec, kDecodeBlock, 1>(p, a)) return gpuErrorInvalidValue;
    if (a.num_tiles == a.tiles_per_row && a.vecs_per_row * kDecodeVec + a.tail <= INT32_MAX) {
      if (a.tail > 0) {
        launch_kernel<static_quant_row_kernel<T, kDecodeVec, kDecodeBlock, true>>(
            a.num_tiles, kDecodeBlock, 0, stream, a);
      } else {
        launch_kernel<static_quant_row_kernel<T, kDecodeVec, kDecodeBlock, false>>(
            a.num_tiles, kDecodeBlock, 0, stream, a);
      }
    } else {
      launch_kernel<static_quant_kernel<T, kDecodeVec, 1, kDecodeBlock>>(a.num_tiles, kDecodeBlock,
                                                                         0, stream, a);
    }
  } else {
    launch_kernel<static_quant_kernel<T, kVec, kUnroll>>(a.num_tiles, kThreads, 0, stream, a);
  }
  return gpuGetLastError();
}

template <typename T, int kVec, int kCache, bool kPerTensor = false>
gpuError_t launch_per_token_kernel(const Rows<T>& a, int64_t tx, int64_t ty, gpuStream_t stream) {
  int64_t blocks = ceil_div(a.rows, ty);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  if constexpr (kCache == 0) {
    launch_kernel<per_token_streaming_kernel<T, kVec>>(grid, block, 0, stream, a);
  } else {
    launch_kernel<per_token_cached_kernel<T, kVec, kCache, kPerTensor>>(grid, block, 0, stream, a);
  }
  return gpuGetLastError();
}

/// The per-token kernels' block for rows of num_vecs vectors: `cache` vectors a thread kept in
/// registers (0: the streaming kernel), tx threads a row (a multiple of the warp size; the
/// tail's < kVec threads always fit), ty rows a block.
struct RowShape {
  int cache = 0;
  int64_t tx = kMaxRowThreads;
  int64_t ty = 1;
};

RowShape row_shape(int64_t num_vecs, int64_t row_threads) {
  constexpr int64_t kWarp = APHRODITE_WARP_SIZE;
  RowShape r;
  for (int c : kCacheSteps) {
    if (num_vecs <= row_threads * c) {
      r.cache = c;
      break;
    }
  }
  if (r.cache == 0 && num_vecs <= int64_t{kMaxRowThreads} * kMaxCache) r.cache = kMaxCache;
  if (r.cache > 0) {
    r.tx = ceil_div(ceil_div(num_vecs, r.cache), kWarp) * kWarp;
    if (r.tx < kWarp) r.tx = kWarp;
    r.ty = r.tx < kRowBlockThreads ? kRowBlockThreads / r.tx : 1;
  }
  return r;
}

template <typename T, int kVec, bool kPerTensor = false>
gpuError_t launch_rows(const Rows<T>& a, const RowShape& r, gpuStream_t stream) {
  switch (r.cache) {
    case 1: return launch_per_token_kernel<T, kVec, 1, kPerTensor>(a, r.tx, r.ty, stream);
    case 2: return launch_per_token_kernel<T, kVec, 2, kPerTensor>(a, r.tx, r.ty, stream);
    case 4: return launch_per_token_kernel<T, kVec, 4, kPerTensor>(a, r.tx, r.ty, stream);
    case 8: return launch_per_token_kernel<T, kVec, 8, kPerTensor>(a, r.tx, r.ty, stream);
    default:
      if constexpr (kPerTensor) return gpuErrorInvalidValue;  // one cached row only
      return launch_per_token_kernel<T, kVec, 0>(a, r.tx, r.ty, stream);
  }
}

template <typename T, int kVec>
Rows<T> make_rows(const QuantProblem& p) {
  Rows<T> a;
  a.out = p.out;
  a.in = static_cast<const T*>(p.input);
  a.scale = p.scale;
  a.scale_ub = p.scale_ub;
  a.rows = p.num_tokens;
  a.out_stride = p.out_row_stride;
  a.in_stride = p.input_row_stride;
  a.vecs_per_row = static_cast<int>(p.hidden / kVec);
  a.tail = static_cast<int>(p.hidden % kVec);
  return a;
}

/// Picks the block shape and register cache for rows of a.vecs_per_row vectors and launches.
template <typename T, int kVec>
gpuError_t launch_per_token_vec(const QuantProblem& p, gpuStream_t stream) {
  const Rows<T> a = make_rows<T, kVec>(p);
  // Fewer rows than SMs (decode sizes): up to kMaxRowThreads threads a row, so that each thread
  // converts fewer elements.
  const int64_t row_threads = p.num_tokens < num_sms() ? kMaxRowThreads : kRowBlockThreads;
  return launch_rows<T, kVec>(a, row_shape(a.vecs_per_row, row_threads), stream);
}

/// Whether p, as one row (gapless rows merged), fits one block of the register-cached row
/// kernel: dynamic per-tensor quantization then takes one launch and one read of the input.
template <typename T, int kVec>
bool dynamic_one_row(const QuantProblem& p) {
  const bool merged =
      p.num_tokens <= 1 || (p.input_row_stride == p.hidden && p.out_row_stride == p.hidden);
  return merged && p.num_tokens * p.hidden > 0 &&
         p.num_tokens * p.hidden / kVec <= int64_t{kMaxRowThreads} * kMaxCache;
}

/// Whether the dynamic per-tensor quantization of p runs as one kernel (one block).
template <typename T, int kVec>
bool dynamic_single_kernel(const QuantProblem& p) {
  Tiles<T> small;
  return dynamic_one_row<T, kVec>(p) ||
         (make_tiles<T, kVec, kSmallThreads>(p, small) && small.num_tiles <= kSmallTiles);
}

template <typename T>
int64_t dynamic_workspace(const QuantProblem& p) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool single = rows_vectorisable<kVec>(p, true) ? dynamic_single_kernel<T, kVec>(p)
                                                       : dynamic_single_kernel<T, 1>(p);
  return single ? 0 : kMaxPartials;
}

template <typename T, int kVec>
gpuError_t launch_dynamic_vec(const QuantProblem& p, gpuStream_t stream) {
  if (dynamic_one_row<T, kVec>(p)) {
    QuantProblem row = p;
    row.hidden = p.num_tokens * p.hidden;
    row.num_tokens = 1;
    row.input_row_stride = row.out_row_stride = row.hidden;
    Rows<T> a = make_rows<T, kVec>(row);
    a.scale_ub = nullptr;
    return launch_rows<T, kVec, true>(a, row_shape(a.vecs_per_row, kMaxRowThreads), stream);
  }
  Tiles<T> small;
  if (!make_tiles<T, kVec, kSmallThreads>(p, small)) return gpuErrorInvalidValue;
  if (small.num_tiles <= kSmallTiles) {
    // Also the path of an empty input, which still writes its scale (0).
    launch_kernel<dynamic_quant_small_kernel<T, kVec>>(1, kSmallThreads, 0, stream, small);
    return gpuGetLastError();
  }
  Tiles<T> a;
  if (!make_tiles<T, kVec, kThreads>(p, a)) return gpuErrorInvalidValue;
  if (p.workspace == nullptr) return gpuErrorInvalidValue;
  const int64_t sms = num_sms();
  static PerDevice absmax_per_sm, quant_per_sm;
  int64_t partials = grid_for(
      a.num_tiles, sms * resident_blocks(absmax_per_sm, absmax_partials_kernel<T, kVec>, kThreads));
  if (partials > kMaxPartials) partials = kMaxPartials;
  a.num_partials = static_cast<int>(partials);
  launch_kernel<absmax_partials_kernel<T, kVec>>(static_cast<unsigned>(partials), kThreads, 0,
                                                 stream, a);
  const gpuError_t err = gpuGetLastError();
  if (err != gpuSuccess) return err;
  const int64_t grid = grid_for(
      a.num_tiles, sms * resident_blocks(quant_per_sm, dynamic_quant_kernel<T, kVec>, kThreads));
  launch_kernel<dynamic_quant_kernel<T, kVec>>(static_cast<unsigned>(grid), kThreads, 0, stream, a);
  return gpuGetLastError();
}

enum class Op { kStatic, kDynamic, kPerToken };

/// Takes the 16-byte path where the pointers and strides allow it, else the one-element path.
template <typename T>
gpuError_t run(Op op, const QuantProblem& p, gpuStream_t stream) {
  if (p.num_tokens < 0 || p.hidden < 0) return gpuErrorInvalidValue;
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vectorised = rows_vectorisable<kVec>(p, op != Op::kPerToken);
  switch (op) {
    case Op::kStatic:
      if (p.num_tokens == 0 || p.hidden == 0) return gpuSuccess;
      return vectorised ? launch_static_vec<T, kVec>(p, stream)
                        : launch_static_vec<T, 1>(p, stream);
    case Op::kDynamic:
      return vectorised ? launch_dynamic_vec<T, kVec>(p, stream)
                        : launch_dynamic_vec<T, 1>(p, stream);
    case Op::kPerToken:
      if (p.num_tokens == 0) return gpuSuccess;
      if (p.hidden > INT32_MAX) return gpuErrorInvalidValue;
      return vectorised ? launch_per_token_vec<T, kVec>(p, stream)
                        : launch_per_token_vec<T, 1>(p, stream);
  }
  return gpuErrorInvalidValue;
}

gpuError_t dispatch(Op op, const QuantProblem& p, gpuStream_t stream) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return run<float>(op, p, stream);
    case ScalarType::kFloat16: return run<__half>(op, p, stream);
    case ScalarType::kBFloat16: return run<__nv_bfloat16>(op, p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace

/// @brief Launches out = e4m3(input / scale[0]) (fp32 division, round to nearest even,
/// saturating) on `stream` for the input type p.dtype. Returns the launch's error code.
gpuError_t launch_static_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream) {
  return dispatch(Op::kStatic, p, stream);
}

int64_t dynamic_scaled_fp8_quant_workspace(const QuantProblem& p) {
  switch (p.dtype) {
    case ScalarType::kFloat32: return dynamic_workspace<float>(p);
    case ScalarType::kFloat16: return dynamic_workspace<__half>(p);
    case ScalarType::kBFloat16: return dynamic_workspace<__nv_bfloat16>(p);
  }
  return 0;
}

/// @brief Launches scale[0] = max|input| / 448 and out = e4m3(input / scale[0]) (dividing by 1
/// where the scale is 0) on `stream`, without synchronising with the host. Returns the first
/// failed launch's error code.
gpuError_t launch_dynamic_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream) {
  return dispatch(Op::kDynamic, p, stream);
}

/// @brief Launches scale[t] = max(min(max|input[t, :]|, scale_ub) / 448, 1 / (448 * 512)) and
/// out[t, :] = e4m3(input[t, :] / scale[t]) on `stream`. Returns the launch's error code.
gpuError_t launch_dynamic_per_token_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream) {
  return dispatch(Op::kPerToken, p, stream);
}

}  // namespace aphrodite::fp8_quant
