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
#include "common/vec.cuh"

namespace aphrodite::activation {
namespace detail {

/// Threads per block (a block may cover several rows when rows are narrow).
inline constexpr int kActThreads = 256;
/// Blocks below this count are considered too few to fill the GPU; blocks shrink to make more.
inline constexpr int64_t kActMinBlocks = 1024;
/// Smallest block the launcher shrinks to.
inline constexpr int kActMinThreads = 64;
/// Below this many 16-byte vectors a thread takes a quarter vector, so that the activation's
/// math, which then bounds the time, spreads over 4x the threads: about a hundred vectors an SM
/// (a token or a few at decode) for silu and the tanh form; four times that for erf's longer
/// code. At 16 tokens x 28672 (57344 vectors) an H100 profile (2026-11-25) ran silu's quarter
/// vectors in 4.0 us against 3.6 us for torch.compile's whole-vector kernel, and the same run's
/// benchmark gave erf with whole vectors 0.91x of torch.compile.
constexpr int64_t act_small_vecs(Kind k) { return k == Kind::kGelu ? 65536 : 16384; }
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
template <Kind K, bool kFast>
__device__ __forceinline__ float act_fn(float x) {
  if constexpr (K == Kind::kSilu) {
    if constexpr (kFast) return __fdividef(x, 1.0f + __expf(-x));
    return x / (1.0f + expf(-x));
  } else if constexpr (K == Kind::kGelu) {
    constexpr float kRsqrt2 = 0.70710678118654752440f;
    return 0.5f * x * (1.0f + erff(x * kRsqrt2));
  } else {
    static_assert(K == Kind::kGeluTanh, "unsupported activation");
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    constexpr float kKappa = 0.044715f;
    const float inner = kSqrt2OverPi * (x + kKappa * x * x * x);
    if constexpr (kFast) return __fdividef(x, 1.0f + __expf(-2.0f * inner));
    return 0.5f * x * (1.0f + tanhf(inner));
  }
}

/// out[t, i] = act(in[t, i]) * in[t, d + i], kVec elements per thread and step. threadIdx.x and
/// blockIdx.x walk the vectors of a row, threadIdx.y and blockIdx.y walk the rows (so blocks
/// that run side by side read neighbouring memory); both loop when the grid is smaller than the
/// problem.
template <Kind K, typename T, int kVec>
__global__ void __launch_bounds__(kActThreads, act_min_blocks(K))
    act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t num_tokens, int64_t d,
                       int64_t out_row_stride, int64_t in_row_stride) {
  using V = Vec<T, kVec>;
  const int64_t num_vecs = d / kVec;
  const int64_t col_begin = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t col_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; t < num_tokens;
       t += row_step) {
    const T* x = in + t * in_row_stride;
    const T* y = x + d;
    T* o = out + t * out_row_stride;
    for (int64_t c = col_begin; c < num_vecs; c += col_step) {
      const V a = *reinterpret_cast<const V*>(x + c * kVec);
      const V b = *reinterpret_cast<const V*>(y + c * kVec);
      V r;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        r.v[i] = from_float<T>(act_fn<K, !std::is_same_v<T, float>>(to_float(a.v[i])) *
                               to_float(b.v[i]));
      }
      *reinterpret_cast<V*>(o + c * kVec) = r;
    }
  }
}

inline bool act_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Picks the block shape (tx threads per row, ty rows per block) and grid, then launches.
template <Kind K, typename T, int kVec>
gpuError_t act_and_mul_launch_vec(const Problem& p, gpuStream_t stream) {
  const int64_t num_vecs = p.d / kVec;
  int64_t tx = 1;
  while (tx < num_vecs && tx < kActThreads) tx *= 2;
  int64_t ty = kActThreads / tx;
  // With few rows, shrink the block so the grid still spreads over every SM.
  while (tx * ty > kActMinThreads &&
         ceil_div(p.num_tokens, ty) * ceil_div(num_vecs, tx) < kActMinBlocks) {
    if (ty > 1) {
      ty /= 2;
    } else {
      tx /= 2;
    }
  }
  int64_t grid_x = ceil_div(num_vecs, tx);
  int64_t grid_y = ceil_div(p.num_tokens, ty);
  if (grid_x > kActMaxGridX) grid_x = kActMaxGridX;
  if (grid_y > kActMaxGridY) grid_y = kActMaxGridY;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  act_and_mul_kernel<K, T, kVec>
      <<<grid, block, 0, stream>>>(static_cast<T*>(p.out), static_cast<const T*>(p.input),
                                   p.num_tokens, p.d, p.out_row_stride, p.input_row_stride);
  return gpuGetLastError();
}

}  // namespace detail

/// @brief Launches out = act(input[:, :d]) * input[:, d:] (computed in fp32, rounded once) on
/// `stream` for element type T, which must match p.dtype. Uses 16-byte loads and stores when d,
/// both row strides and both pointers allow it (4-byte ones for small problems), element-wise
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
  if (vectorised && p.num_tokens * (p.d / kVec) < detail::act_small_vecs(K)) {
    return detail::act_and_mul_launch_vec<K, T, (kVec >= 4 ? kVec / 4 : 1)>(p, stream);
  }
  if (vectorised) return detail::act_and_mul_launch_vec<K, T, kVec>(p, stream);
  return detail::act_and_mul_launch_vec<K, T, 1>(p, stream);
}

}  // namespace aphrodite::activation
