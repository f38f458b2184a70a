// GPU kernel of moe_sum (moe_sum.h): out[t, :] = sum_k input[t, k, :], fp32 accumulation.
//
// Bandwidth-bound: each thread owns one vector of kN elements (16 bytes where pointers and
// strides allow, else one element) of a token's hidden row and issues the k loads of it back to
// back (k is a template parameter up to kMaxUnrolledK), so a thread keeps k loads in flight.
// Blocks are (vectors of a row) x (rows): x walks a row's vectors and y the tokens, so no thread
// divides to find its token and its loads issue at once; a narrow row shares its block with
// others, and a decode-sized problem (one token) still spreads over many SMs. Torch-free.
#include "moe/moe_sum.h"

#include <cstdint>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace aphrodite::moe {
namespace {

// Small blocks: a decode-sized row (one token) still spreads over many SMs.
constexpr int kThreads = 128;
constexpr int kMaxUnrolledK = 8;
constexpr int64_t kMaxGridX = int64_t{1} << 20;
constexpr int64_t kMaxGridY = 65535;

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

/// acc += x, element by element in fp32.
template <typename T, int kN>
__device__ __forceinline__ void accumulate(float (&acc)[kN], const Vec<T, kN>& x) {
#pragma unroll
  for (int q = 0; q < kN; ++q) acc[q] += to_float(x.v[q]);
}

/// The sums rounded once to T.
template <typename T, int kN>
__device__ __forceinline__ Vec<T, kN> rounded(const float (&acc)[kN]) {
  Vec<T, kN> r;
#pragma unroll
  for (int q = 0; q < kN; ++q) r.v[q] = from_float<T>(acc[q]);
  return r;
}

/// kN elements a thread (one load each of the k rows). kK > 0: topk == kK, unrolled; kK == 0:
/// any topk. Threads (x, y) of block (bx, by) own vector bx * blockDim.x + x of token
/// by * blockDim.y + y; both loop when the grid is smaller than the problem.
template <typename T, int kN, int kK>
__global__ void __launch_bounds__(kThreads) moe_sum_kernel(const SumArgs<T> a) {
  pdl_prologue();
  using V = Vec<T, kN>;
  const int64_t vecs = a.hidden / kN;
  const int64_t col_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; t < a.num_tokens;
       t += row_step) {
    const T* row = a.in + t * a.in_token_stride;
    T* out = a.out + t * a.out_stride;
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs;
         v += col_step) {
      const T* src = row + v * kN;
      float acc[kN];
#pragma unroll
      for (int q = 0; q < kN; ++q) acc[q] = 0.0f;
      if constexpr (kK > 0) {
        V x[kK];
#pragma unroll
        for (int k = 0; k < kK; ++k) x[k] = *reinterpret_cast<const V*>(src + k * a.in_k_stride);
#pragma unroll
        for (int k = 0; k < kK; ++k) accumulate(acc, x[k]);
      } else {
        for (int64_t k = 0; k < a.topk; ++k) {
          const V x = *reinterpret_cast<const V*>(src + k * a.in_k_stride);
          accumulate(acc, x);
        }
      }
      *reinterpret_cast<V*>(out + v * kN) = rounded<T>(acc);
    }
  }
}

/// Decode sizes (few vectors in all): the k loads of a vector spread over kK threads, so that
/// every thread has one load in flight (ptxas issues a thread's k loads in groups of about
/// three, each group a memory round trip, to save registers). A block is kSplitVecs vectors x kK
/// threads: thread (g, j) loads k = g of the block's vector j (neighbouring j read neighbouring
/// memory); the kK vectors meet in shared memory, where thread j sums them in ascending k, the
/// order of moe_sum_kernel, so that both give the same bits.
constexpr int kSplitVecs = 16;

template <typename T, int kN, int kK>
__global__ void __launch_bounds__(kSplitVecs* kMaxUnrolledK)
    moe_sum_split_kernel(const SumArgs<T> a) {
  pdl_prologue();
  using V = Vec<T, kN>;
  __shared__ V tile[kK][kSplitVecs];
  const int j = static_cast<int>(threadIdx.x % kSplitVecs);
  const int g = static_cast<int>(threadIdx.x / kSplitVecs);
  const int64_t vecs = a.hidden / kN;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kSplitVecs + j;
  const int64_t t = blockIdx.y;
  if (v < vecs) {
    tile[g][j] =
        *reinterpret_cast<const V*>(a.in + t * a.in_token_stride + g * a.in_k_stride + v * kN);
  }
  __syncthreads();
  if (g != 0 || v >= vecs) return;
  float acc[kN];
#pragma unroll
  for (int q = 0; q < kN; ++q) acc[q] = 0.0f;
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    const V x = tile[k][j];  // one shared load of the vector
    accumulate(acc, x);
  }
  *reinterpret_cast<V*>(a.out + t * a.out_stride + v * kN) = rounded<T>(acc);
}

/// Problems of at most this many vectors (all tokens) take moe_sum_split_kernel.
constexpr int64_t kSplitMaxVecs = 8192;

template <typename T, int kN, int kK>
gpuError_t launch(const SumArgs<T>& a, gpuStream_t stream) {
  const int64_t vecs = a.hidden / kN;
  if constexpr (kK >= 2) {
    if (a.num_tokens * vecs <= kSplitMaxVecs && a.num_tokens <= kMaxGridY) {
      const dim3 grid(static_cast<unsigned>(ceil_div(vecs, kSplitVecs)),
                      static_cast<unsigned>(a.num_tokens));
      launch_kernel<moe_sum_split_kernel<T, kN, kK>>(grid, kSplitVecs * kK, 0, stream, a);
      return gpuGetLastError();
    }
  }
  int64_t tx = 32;
  while (tx < vecs && tx < kThreads) tx *= 2;
  const int64_t ty = kThreads / tx;
  int64_t gx = ceil_div(vecs, tx), gy = ceil_div(a.num_tokens, ty);
  if (gx > kMaxGridX) gx = kMaxGridX;
  if (gy > kMaxGridY) gy = kMaxGridY;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
  launch_kernel<moe_sum_kernel<T, kN, kK>>(grid, block, 0, stream, a);
  return gpuGetLastError();
}

template <typename T, int kN>
gpuError_t launch_topk(const SumArgs<T>& a, gpuStream_t stream) {
  switch (a.topk) {
    case 1: return launch<T, kN, 1>(a, stream);
    case 2: return launch<T, kN, 2>(a, stream);
    case 3: return launch<T, kN, 3>(a, stream);
    case 4: return launch<T, kN, 4>(a, stream);
    case 5: return launch<T, kN, 5>(a, stream);
    case 6: return launch<T, kN, 6>(a, stream);
    case 7: return launch<T, kN, 7>(a, stream);
    case 8: return launch<T, kN, kMaxUnrolledK>(a, stream);
    default: return launch<T, kN, 0>(a, stream);
  }
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
  return vec ? launch_topk<T, kN>(a, stream) : launch_topk<T, 1>(a, stream);
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
