// GPU kernels for the gated activations of activation.h, as header templates. The code generator
// emits one .cu per (Kind, element type) that includes this file and explicitly instantiates
// act_and_mul_launch; the dispatch file then picks the instantiation for a problem.
// Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "activation/activation.h"
#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace aphrodite::activation {
namespace detail {

/// Threads per block (a block may cover several rows when rows are narrow).
inline constexpr int kActThreads = 256;
/// Blocks below this count are considered too few to fill the GPU: the launcher halves the block
/// (to no fewer than kActMinThreads) while the grid has fewer. Set when the decode sizes ran whole
/// or quarter vectors (H100, same run, 16 tokens x 28672 against torch.compile: erf 0.93x ->
/// 0.99x, silu 0.99x -> 1.00x, tanh form 0.97x -> 1.00x against 1024 blocks); with half vectors
/// from 2 to 14 tokens of 28672 it still shrinks a block, at 1 token the grid is 56 blocks of 128.
inline constexpr int64_t kActMinBlocks = 400;
/// Smallest block the launcher shrinks to.
inline constexpr int kActMinThreads = 128;
/// Below this many 16-byte vectors (73 tokens x 28672) a thread takes half a vector: twice the
/// threads, each with half the math and a shorter chain of it, for the decode sizes, where the
/// math and the launch bound the time rather than the bytes. H200, bf16 x 28672, calls replayed
/// back to back from a CUDA graph (2026-11-28, us, silu / erf), against the rule before (quarter
/// vectors below 16384 / 65536 vectors, else whole; blocks of at least 64 threads): 1 token
/// 1.33 / 1.42 against 1.42 / 1.46, 16 tokens 1.71 / 2.10 against 1.80 / 2.08, 64 tokens
/// 2.68 / 4.00 against 2.83 / 3.99; 1-element threads in torch.compile's shape (224 blocks of 128
/// at one token) 1.38 / 1.42, and 3.3-9.9 at 16 and 64 tokens.
inline constexpr int64_t kActSmallVecs = int64_t{1} << 18;
/// Grid limits; the kernel loops when the problem needs more blocks than these.
inline constexpr int64_t kActMaxGridX = int64_t{1} << 20;
inline constexpr int64_t kActMaxGridY = 65535;

/// Resident blocks per SM the kernel is compiled for. erf's inlined code took 43 registers a
/// thread (5 blocks of 256 an SM); capped at 32 (8 blocks, every thread slot of an H100 SM) it
/// does not spill. silu and the tanh form spill under that cap, so they keep the compiler's
/// choice.
constexpr int act_min_blocks(Kind k) { return k == Kind::kGelu ? 2048 / kActThreads : 1; }

/// The activation applied to the first half of a row, in fp32. kFast (16-bit outputs): silu and
/// the tanh form as x * sigmoid(z) (1 + tanh(u) = 2 sigmoid(2u) exactly, so nothing cancels) with
/// the hardware exp2 and an approximate divide; their relative error (about 1e-6) is far below
/// the output's rounding, and they issue a fraction of the precise forms' instructions, which
/// bound the kernel at decode sizes. fp32 outputs keep the precise expf, division and tanhf.
/// GELU keeps erff either way.
/// e^x by the hardware's 2^x with denormal results (and arguments) flushed to zero, which the
/// 1 + e^x it feeds cannot tell from zero: __expf's unflushed form adds a compare and two
/// predicated multiplies an element.
__device__ __forceinline__ float fast_exp(float x) {
#if defined(USE_ROCM)
  return __expf(x);
#else
  constexpr float kLog2e = 1.44269504088896340736f;
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * kLog2e));
  return y;
#endif
}

template <Kind K, bool kFast>
__device__ __forceinline__ float act_fn(float x) {
  if constexpr (K == Kind::kSilu) {
    if constexpr (kFast) return __fdividef(x, 1.0f + fast_exp(-x));
    return x / (1.0f + expf(-x));
  } else if constexpr (K == Kind::kGelu) {
    constexpr float kRsqrt2 = 0.70710678118654752440f;
    return 0.5f * x * (1.0f + erff(x * kRsqrt2));
  } else {
    static_assert(K == Kind::kGeluTanh, "unsupported activation");
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    constexpr float kKappa = 0.044715f;
    const float inner = kSqrt2OverPi * (x + kKappa * x * x * x);
    if constexpr (kFast) return __fdividef(x, 1.0f + fast_exp(-2.0f * inner));
    return 0.5f * x * (1.0f + tanhf(inner));
  }
}

/// r = act(a) * b elementwise (fp32 math, one rounding).
template <Kind K, typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> act_vec(const Vec<T, kVec>& a, const Vec<T, kVec>& b) {
  Vec<T, kVec> r;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    r.v[i] =
        from_float<T>(act_fn<K, !std::is_same_v<T, float>>(to_float(a.v[i])) * to_float(b.v[i]));
  }
  return r;
}

/// out[t, i] = act(in[t, i]) * in[t, d + i], kVec elements per thread and step. threadIdx.x and
/// blockIdx.x walk the vectors of a row, threadIdx.y and blockIdx.y walk the rows (so blocks
/// that run side by side read neighbouring memory).
/// num_vecs = d / kVec. Index (int or int64_t) holds every element offset of the launch.
/// kGridStride: both walks loop when the grid is smaller than the problem; without it the grid
/// covers the problem and a thread takes at most one vector (no loop, no 64-bit arithmetic: the
/// decode sizes' kernel).
template <Kind K, typename T, int kVec, typename Index, bool kGridStride>
__global__ void __launch_bounds__(kActThreads, act_min_blocks(K))
    act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, Index num_tokens, Index d,
                       Index num_vecs, Index out_row_stride, Index in_row_stride) {
  using V = Vec<T, kVec>;
  const Index col_begin = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
                          static_cast<Index>(threadIdx.x);
  const Index row_begin = static_cast<Index>(blockIdx.y) * static_cast<Index>(blockDim.y) +
                          static_cast<Index>(threadIdx.y);
  pdl_prologue();
  if constexpr (!kGridStride) {
    if (row_begin >= num_tokens || col_begin >= num_vecs) return;
    const Index x = row_begin * in_row_stride + col_begin * kVec;
    const V a = *reinterpret_cast<const V*>(in + x);
    const V b = *reinterpret_cast<const V*>(in + (x + d));
    *reinterpret_cast<V*>(out + (row_begin * out_row_stride + col_begin * kVec)) =
        act_vec<K, T, kVec>(a, b);
  } else {
    const Index col_step = static_cast<Index>(gridDim.x) * blockDim.x;
    const Index row_step = static_cast<Index>(gridDim.y) * blockDim.y;
    for (Index t = row_begin; t < num_tokens; t += row_step) {
      const T* x = in + t * in_row_stride;
      const T* y = x + d;
      T* o = out + t * out_row_stride;
      for (Index c = col_begin; c < num_vecs; c += col_step) {
        const V a = *reinterpret_cast<const V*>(x + c * kVec);
        const V b = *reinterpret_cast<const V*>(y + c * kVec);
        *reinterpret_cast<V*>(o + c * kVec) = act_vec<K, T, kVec>(a, b);
      }
    }
  }
}

inline bool act_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Whether every element offset the kernel forms (rows of both tensors, the gate half included)
/// fits an int: the one-vector-a-thread kernel then indexes in 32 bits. Strides are >= 0.
inline bool act_offsets_fit_int(const Problem& p) {
  constexpr int64_t kMax = INT32_MAX;
  if (p.d > kMax / 2 || p.num_tokens > kMax) return false;
  const int64_t rows = p.num_tokens - 1;
  auto fits = [&](int64_t stride, int64_t width) {
    return stride >= 0 && (rows == 0 || stride <= (kMax - width) / rows);
  };
  return fits(p.input_row_stride, 2 * p.d) && fits(p.out_row_stride, p.d);
}

/// Picks the block shape (tx threads per row, ty rows per block) and grid, then launches.
template <Kind K, typename T, int kVec>
gpuError_t act_and_mul_launch_vec(const Problem& p, gpuStream_t stream) {
  const int64_t num_vecs = p.d / kVec;
  int64_t tx = 1;
  while (tx < num_vecs && tx < kActThreads) tx *= 2;
  int64_t ty = kActThreads / tx;
  // With few rows, shrink the block toward kActMinBlocks blocks.
  while (tx * ty > kActMinThreads &&
         ceil_div(p.num_tokens, ty) * ceil_div(num_vecs, tx) < kActMinBlocks) {
    if (ty > 1) {
      ty /= 2;
    } else {
      tx /= 2;
    }
  }
  const int64_t grid_x = ceil_div(num_vecs, tx);
  const int64_t grid_y = ceil_div(p.num_tokens, ty);
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  T* out = static_cast<T*>(p.out);
  const T* in = static_cast<const T*>(p.input);
  if (grid_x <= kActMaxGridX && grid_y <= kActMaxGridY && act_offsets_fit_int(p)) {
    const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
    return launch_kernel<act_and_mul_kernel<K, T, kVec, int, false>>(
        grid, block, 0, stream, out, in, static_cast<int>(p.num_tokens), static_cast<int>(p.d),
        static_cast<int>(num_vecs), static_cast<int>(p.out_row_stride),
        static_cast<int>(p.input_row_stride));
  } else {
    const dim3 grid(static_cast<unsigned>(grid_x < kActMaxGridX ? grid_x : kActMaxGridX),
                    static_cast<unsigned>(grid_y < kActMaxGridY ? grid_y : kActMaxGridY));
    return launch_kernel<act_and_mul_kernel<K, T, kVec, int64_t, true>>(
        grid, block, 0, stream, out, in, p.num_tokens, p.d, num_vecs, p.out_row_stride,
        p.input_row_stride);
  }
}

}  // namespace detail

/// @brief Launches out = act(input[:, :d]) * input[:, d:] (computed in fp32, rounded once) on
/// `stream` for element type T, which must match p.dtype. Uses 16-byte loads and stores when d,
/// both row strides and both pointers allow it (8-byte ones for the decode sizes), element-wise
/// accesses otherwise. Returns the launch's error code (gpuSuccess without launching when there
/// is nothing to do).
template <Kind K, typename T>
gpuError_t act_and_mul_launch(const Problem& p, gpuStream_t stream) {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
      "unsupported element type");
  if (p.num_tokens <= 0 || p.d <= 0) return gpuSuccess;
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vectorised = p.d % kVec == 0 && p.out_row_stride % kVec == 0 &&
                          p.input_row_stride % kVec == 0 && detail::act_aligned16(p.out) &&
                          detail::act_aligned16(p.input);
  if (vectorised && p.num_tokens * (p.d / kVec) < detail::kActSmallVecs) {
    return detail::act_and_mul_launch_vec<K, T, (kVec >= 2 ? kVec / 2 : 1)>(p, stream);
  }
  if (vectorised) return detail::act_and_mul_launch_vec<K, T, kVec>(p, stream);
  return detail::act_and_mul_launch_vec<K, T, 1>(p, stream);
}

}  // namespace aphrodite::activation
