// GPU kernels for RMS normalisation, plain and fused with the residual add (layernorm.h).
// Narrow rows share a block (a group of up to one warp per row); wide rows get a block each.
// Rows of up to 4096 vectors stay in registers between the sum-of-squares pass and the output
// pass; wider rows are read twice. Torch-free.
#include "layernorm/layernorm.h"

#include <cstdint>
#include <type_traits>

#include "common/gpu.h"

namespace aphrodite::layernorm {
namespace {

#if defined(USE_ROCM)
constexpr gpuError_t kErrorInvalidValue = hipErrorInvalidValue;
#else
constexpr gpuError_t kErrorInvalidValue = cudaErrorInvalidValue;
#endif

/// Largest block; also the launch bound of the kernel that re-reads rows.
constexpr int kMaxThreads = 1024;
/// Largest block of the kernels that keep rows in registers; also their launch bound.
constexpr int kMaxCachedThreads = 512;
/// Threads per block when several narrow rows share a block.
constexpr int kMultiRowThreads = 256;
/// Wide rows: threads per row are a multiple of this (a whole number of warps on every vendor).
constexpr int kThreadQuantum = 64;
/// Vectors per thread a row-in-registers block of at most 256 threads may hold, tried in order.
constexpr int kCacheSteps[] = {1, 2, 4, 8};
/// Largest register cache (vectors per thread), used with up to 512 threads per row.
constexpr int kMaxCache = 8;
/// Rows (or row groups) each block of the pipelined kernel handles.
constexpr int64_t kRowsPerBlock = 4;
/// Grid limit; the kernels loop over rows beyond it.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

/// N consecutive elements moved with one load or store of sizeof(T) * N bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

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

/// Hides v's value from the optimiser, so that the fp32 copies made for the sum of squares are
/// not kept alive until the output pass (the packed elements take half the registers).
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
};

/// Sum of `v` over the blockDim.x threads of this thread's row; every one of them gets the same
/// value. Narrow rows (blockDim.x a power of two <= warp size) reduce with shuffles inside their
/// lane group; wide rows (blockDim.y == 1, blockDim.x a multiple of the warp size) go through
/// shared memory. Every thread of the block must call it.
__device__ __forceinline__ float row_sum(float v, float* smem) {
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
  float total = 0.0f;
  for (int i = 0; i < num_warps; ++i) total += smem[i];
  __syncthreads();  // smem is reused by the next row
  return total;
}

/// Plain rms_norm with the row in registers (kCache vectors per thread, which must cover it),
/// software-pipelined over the rows a block handles (row, row + rows of the grid, ...): the loads
/// of the next row are issued before the current row is normalised and stored, so every block
/// keeps loads in flight through its store phase.
template <typename T, int kVec, int kCache>
__global__ void __launch_bounds__(kMaxCachedThreads) rms_norm_pipelined_kernel(const NormArgs<T> a) {
  using V = Vec<T, kVec>;
  __shared__ float smem[32];
  const int num_vecs = static_cast<int>(a.hidden / kVec);
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const float hidden = static_cast<float>(a.hidden);
  const V* w = reinterpret_cast<const V*>(a.weight);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  auto load_row = [&](int64_t row, V (&dst)[kCache]) {
    if (row < a.rows) {
      const V* x = reinterpret_cast<const V*>(a.in + row * a.in_stride);
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (c < num_vecs) dst[i] = x[c];
      }
    }
  };

  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  V cur[kCache] = {};
  load_row(row, cur);
  // The loop bound is uniform across the block, so every thread reaches every row_sum.
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < a.rows;
       row0 += row_step, row += row_step) {
    const bool valid = row < a.rows;
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int c = first + i * tx;
      if (valid && c < num_vecs) {
        const V& v = cur[i];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float f = to_float(v.v[e]);
          ss += f * f;
        }
      }
    }
    const float inv_rms = rsqrtf(row_sum(ss, smem) / hidden + a.epsilon);
    V next[kCache] = {};
    load_row(row + row_step, next);
    if (valid) {
      V* o = reinterpret_cast<V*>(a.out + row * a.out_stride);
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (c < num_vecs) {
          launder(cur[i]);
          const V wv = w[c];
          V y;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            y.v[e] = from_float<T>(to_float(cur[i].v[e]) * inv_rms * to_float(wv.v[e]));
          }
          o[c] = y;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kCache; ++i) cur[i] = next[i];
  }
}

/// One row per threadIdx.y; threadIdx.x walks the row's vectors of kVec elements. kCache > 0:
/// thread x holds vectors x, x + blockDim.x, ... (kCache of them) in registers, which must cover
/// the row. kCache == 0: any width, the second pass re-reads the row. The host guarantees that
/// hidden / kVec fits an int.
template <typename T, int kVec, int kCache, bool kFused>
__global__ void __launch_bounds__(kCache > 0 ? kMaxCachedThreads : kMaxThreads)
    rms_norm_kernel(const NormArgs<T> a) {
  using V = Vec<T, kVec>;
  __shared__ float smem[32];
  const int num_vecs = static_cast<int>(a.hidden / kVec);
  const int tx = static_cast<int>(blockDim.x);
  const int first = static_cast<int>(threadIdx.x);
  const float hidden = static_cast<float>(a.hidden);
  const V* w = reinterpret_cast<const V*>(a.weight);
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  // The loop bound is uniform across the block, so every thread reaches every row_sum.
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < a.rows;
       row0 += row_step) {
    const int64_t row = row0 + threadIdx.y;
    const bool valid = row < a.rows;
    const int64_t r = valid ? row : 0;
    const V* x = reinterpret_cast<const V*>(a.in + r * a.in_stride);
    V* o = reinterpret_cast<V*>(a.out + r * a.out_stride);
    V* res = nullptr;
    if constexpr (kFused) res = reinterpret_cast<V*>(a.residual + r * a.residual_stride);

    // First pass over vector c: the input, or the rounded input + residual (stored back).
    auto load_first = [&](int c) {
      V v = x[c];
      if constexpr (kFused) {
        const V rv = res[c];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          v.v[i] = from_float<T>(to_float(v.v[i]) + to_float(rv.v[i]));
        }
        res[c] = v;
      }
      return v;
    };
    auto sum_squares = [](const V& v) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float f = to_float(v.v[i]);
        s += f * f;
      }
      return s;
    };
    auto normalise = [&](const V& v, const V& wv, float inv_rms) {
      V y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        y.v[i] = from_float<T>(to_float(v.v[i]) * inv_rms * to_float(wv.v[i]));
      }
      return y;
    };

    float ss = 0.0f;
    if constexpr (kCache > 0) {
      // The weights are loaded with the row so that their latency overlaps the row's.
      V cache[kCache];
      V wcache[kCache];
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (valid && c < num_vecs) {
          cache[i] = load_first(c);
          wcache[i] = w[c];
          ss += sum_squares(cache[i]);
        }
      }
      const float inv_rms = rsqrtf(row_sum(ss, smem) / hidden + a.epsilon);
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int c = first + i * tx;
        if (valid && c < num_vecs) {
          launder(cache[i]);
          launder(wcache[i]);
          o[c] = normalise(cache[i], wcache[i], inv_rms);
        }
      }
    } else {
      for (int c = first; valid && c < num_vecs; c += tx) ss += sum_squares(load_first(c));
      const float inv_rms = rsqrtf(row_sum(ss, smem) / hidden + a.epsilon);
      // Fused: re-read the residual this thread stored in the first pass.
      const V* src = x;
      if constexpr (kFused) src = res;
      for (int c = first; valid && c < num_vecs; c += tx) o[c] = normalise(src[c], w[c], inv_rms);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int kVec, int kCache, bool kFused>
gpuError_t launch_kernel(const NormArgs<T>& a, int64_t tx, int64_t ty, gpuStream_t stream) {
  constexpr bool kPipelined = kCache > 0 && !kFused;
  int64_t blocks = ceil_div(a.rows, ty);
  if (kPipelined) blocks = ceil_div(blocks, kRowsPerBlock);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  if constexpr (kPipelined) {
    rms_norm_pipelined_kernel<T, kVec, kCache><<<grid, block, 0, stream>>>(a);
  } else {
    rms_norm_kernel<T, kVec, kCache, kFused><<<grid, block, 0, stream>>>(a);
  }
  return gpuGetLastError();
}

/// Picks the block shape and register cache for rows of hidden / kVec vectors and launches.
template <typename T, int kVec, bool kFused>
gpuError_t launch_shaped(const NormArgs<T>& a, gpuStream_t stream) {
  const int64_t num_vecs = a.hidden / kVec;
  int64_t tx = 1;
  int64_t ty = 1;
  int cache = 0;
  if (num_vecs <= 32) {
    // Narrow rows: a power-of-two lane group per row, several rows per block.
    while (tx < num_vecs) tx *= 2;
    ty = kMultiRowThreads / tx;
    cache = 1;
  } else {
    for (int c : kCacheSteps) {
      if (num_vecs <= int64_t{kMultiRowThreads} * c) {
        cache = c;
        break;
      }
    }
    if (cache == 0 && num_vecs <= int64_t{kMaxCachedThreads} * kMaxCache) cache = kMaxCache;
    if (cache > 0) {
      tx = ceil_div(ceil_div(num_vecs, cache), kThreadQuantum) * kThreadQuantum;
    } else {
      tx = kMaxThreads;
    }
  }
  switch (cache) {
    case 1: return launch_kernel<T, kVec, 1, kFused>(a, tx, ty, stream);
    case 2: return launch_kernel<T, kVec, 2, kFused>(a, tx, ty, stream);
    case 4: return launch_kernel<T, kVec, 4, kFused>(a, tx, ty, stream);
    case 8: return launch_kernel<T, kVec, 8, kFused>(a, tx, ty, stream);
    default: return launch_kernel<T, kVec, 0, kFused>(a, tx, ty, stream);
  }
}

/// Takes the 16-byte path when the row width, every stride and every pointer allow it.
template <typename T, bool kFused>
gpuError_t launch_typed(const NormArgs<T>& a, gpuStream_t stream) {
  if (a.rows <= 0 || a.hidden <= 0) return gpuSuccess;
  if (a.hidden > INT32_MAX) return kErrorInvalidValue;
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  bool vectorised = a.hidden % kVec == 0 && a.out_stride % kVec == 0 &&
                    a.in_stride % kVec == 0 && aligned16(a.out) && aligned16(a.in) &&
                    aligned16(a.weight);
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
  return kErrorInvalidValue;
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
  return kErrorInvalidValue;
}

}  // namespace aphrodite::layernorm
