// GPU kernel of moe_sum (moe_sum.h): out[t, :] = sum_k input[t, k, :], fp32 accumulation.
//
// Bandwidth-bound: each thread owns one 16-byte vector of a token's hidden row and issues the k
// loads of it back to back (k is a template parameter up to kMaxUnrolledK), so a thread keeps k
// 16-byte loads in flight. The threads of the grid walk the (token, vector) pairs flat, so decode
// sizes (one token) still spread over the whole GPU. Rows whose pointers or strides do not allow
// 16-byte access take a scalar kernel. Torch-free.
#include "moe/moe_sum.h"

#include <cstdint>

#include "common/gpu.h"
#include "common/vec.cuh"

namespace aphrodite::moe {
namespace {

// Small blocks: a decode-sized row (one token) still spreads over many SMs.
constexpr int kThreads = 128;
constexpr int kMaxUnrolledK = 8;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <typename T>
struct SumArgs {
  T* out;
  const T* in;
  int64_t num_tokens;
  int64_t topk;
  int64_t hidden;
  int64_t out_stride;
  int64_t in_token_stride;
  int64_t in_k_stride;
};

/// Vector path: kN elements per thread (16 bytes). kK > 0: topk == kK, unrolled; kK == 0: any topk.
template <typename T, int kK>
__global__ void __launch_bounds__(kThreads) moe_sum_vec_kernel(const SumArgs<T> a) {
  constexpr int kN = 16 / sizeof(T);
  using V = Vec<T, kN>;
  const int64_t vecs = a.hidden / kN;
  const int64_t work = a.num_tokens * vecs;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; idx < work;
       idx += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = idx / vecs;
    const int64_t col = (idx - t * vecs) * kN;
    const T* src = a.in + t * a.in_token_stride + col;
    float acc[kN];
#pragma unroll
    for (int q = 0; q < kN; ++q) acc[q] = 0.0f;
    if constexpr (kK > 0) {
      V v[kK];
#pragma unroll
      for (int k = 0; k < kK; ++k) v[k] = *reinterpret_cast<const V*>(src + k * a.in_k_stride);
#pragma unroll
      for (int k = 0; k < kK; ++k) {
#pragma unroll
        for (int q = 0; q < kN; ++q) acc[q] += to_float(v[k].v[q]);
      }
    } else {
      for (int64_t k = 0; k < a.topk; ++k) {
        const V v = *reinterpret_cast<const V*>(src + k * a.in_k_stride);
#pragma unroll
        for (int q = 0; q < kN; ++q) acc[q] += to_float(v.v[q]);
      }
    }
    V r;
#pragma unroll
    for (int q = 0; q < kN; ++q) r.v[q] = from_float<T>(acc[q]);
    *reinterpret_cast<V*>(a.out + t * a.out_stride + col) = r;
  }
}

/// Scalar path for any alignment.
template <typename T>
__global__ void __launch_bounds__(kThreads) moe_sum_scalar_kernel(const SumArgs<T> a) {
  const int64_t work = a.num_tokens * a.hidden;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; idx < work;
       idx += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = idx / a.hidden;
    const int64_t col = idx - t * a.hidden;
    const T* src = a.in + t * a.in_token_stride + col;
    float acc = 0.0f;
    for (int64_t k = 0; k < a.topk; ++k) acc += to_float(src[k * a.in_k_stride]);
    a.out[t * a.out_stride + col] = from_float<T>(acc);
  }
}

unsigned grid_for(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <typename T, int kK>
gpuError_t launch_vec(const SumArgs<T>& a, gpuStream_t stream) {
  constexpr int kN = 16 / sizeof(T);
  moe_sum_vec_kernel<T, kK><<<grid_for(a.num_tokens * (a.hidden / kN)), kThreads, 0, stream>>>(a);
  return gpuGetLastError();
}

template <typename T>
gpuError_t launch_typed(const MoeSumProblem& p, gpuStream_t stream) {
  SumArgs<T> a;
  a.out = static_cast<T*>(p.out);
  a.in = static_cast<const T*>(p.input);
  a.num_tokens = p.num_tokens;
  a.topk = p.topk;
  a.hidden = p.hidden;
  a.out_stride = p.out_token_stride;
  a.in_token_stride = p.in_token_stride;
  a.in_k_stride = p.in_k_stride;
  constexpr int64_t kN = 16 / sizeof(T);
  const bool vec = reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && p.hidden % kN == 0 &&
                   p.out_token_stride % kN == 0 && p.in_token_stride % kN == 0 &&
                   p.in_k_stride % kN == 0;
  if (!vec) {
    moe_sum_scalar_kernel<T><<<grid_for(p.num_tokens * p.hidden), kThreads, 0, stream>>>(a);
    return gpuGetLastError();
  }
  switch (p.topk) {
    case 1: return launch_vec<T, 1>(a, stream);
    case 2: return launch_vec<T, 2>(a, stream);
    case 3: return launch_vec<T, 3>(a, stream);
    case 4: return launch_vec<T, 4>(a, stream);
    case 5: return launch_vec<T, 5>(a, stream);
    case 6: return launch_vec<T, 6>(a, stream);
    case 7: return launch_vec<T, 7>(a, stream);
    case 8: return launch_vec<T, kMaxUnrolledK>(a, stream);
    default: return launch_vec<T, 0>(a, stream);
  }
}

}  // namespace

/// @brief Launches moe_sum on `stream` for p.dtype: out = the fp32 sum over k of input, rounded
/// once to the element type. Returns the launch's error code.
gpuError_t launch_moe_sum(const MoeSumProblem& p, gpuStream_t stream) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return gpuSuccess;
  if (p.topk < 0) return gpuErrorInvalidValue;
  switch (p.dtype) {
    case ScalarType::kFloat32: return launch_typed<float>(p, stream);
    case ScalarType::kFloat16: return launch_typed<__half>(p, stream);
    case ScalarType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace aphrodite::moe
