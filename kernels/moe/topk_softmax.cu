// GPU kernel for MoE routing (topk_softmax.h): fp32 softmax over each token's expert logits,
// then the k most probable experts, descending, ties to the lower expert id.
//
// Selection works on 64-bit keys that order (probability, -expert id) and are distinct within a
// row; round j of the top-k takes the largest key below round j-1's, so no expert is picked
// twice and NaN probabilities (ranked below every number) cannot break it.
//
// Fast path (num_experts <= 512, k <= 8): a group of kLanes lanes (a power of two, 1..32) per
// token, each lane holding kPerLane consecutive experts in registers. Generic path (anything
// else): a block per token that re-reads the row from global memory (L1/L2) each round.
// Torch-free.
#include "moe/topk_softmax.h"

#include <cstdint>
#include <type_traits>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace aphrodite::moe {
namespace {

/// The fast path's limits.
constexpr int64_t kFastMaxExperts = 512;
constexpr int kFastMaxK = 8;
/// Experts per lane the fast path aims for (8 bf16 logits are one 16-byte load).
constexpr int kFastTargetPerLane = 8;
/// Threads per block of the fast path.
constexpr int kFastThreads = 128;
/// Largest block of the generic path.
constexpr int kGenericThreads = 256;
/// Grid limit; the kernels loop over tokens beyond it.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

using Key = unsigned long long;

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }

/// A key that orders by p (NaN below every number), then by lower expert id; never 0, so 0 can
/// stand for "no expert". Distinct ids give distinct keys.
__device__ __forceinline__ Key make_key(float p, uint32_t id) {
  uint32_t hi = 0;  // NaN
  if (p == p) {
    const uint32_t bits = __float_as_uint(p);
    hi = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<Key>(hi) << 32) | static_cast<Key>(0xffffffffu - id);
}

__device__ __forceinline__ float key_prob(Key key) {
  const uint32_t hi = static_cast<uint32_t>(key >> 32);
  if (hi == 0) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((hi & 0x80000000u) != 0 ? (hi & 0x7fffffffu) : ~hi);
}

__device__ __forceinline__ int32_t key_id(Key key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

__device__ __forceinline__ Key key_max(Key a, Key b) { return a > b ? a : b; }

template <typename T>
struct Args {
  float* weights;
  int32_t* indices;
  int32_t* token_expert_indices;
  const T* gating;
  int64_t num_tokens;
  int64_t num_experts;
  int64_t k;
  int64_t row_stride;
  bool renormalize;
};

/// Largest power of two dividing kPerLane whose elements fit one 16-byte load.
template <typename T>
__host__ __device__ constexpr int load_width(int per_lane) {
  int w = 1;
  while (per_lane % (2 * w) == 0 && 2 * w * static_cast<int>(sizeof(T)) <= 16) w *= 2;
  return w;
}

/// Fast path: kLanes consecutive lanes per token (kFastThreads / kLanes tokens per block), lane g
/// of a group holding experts [g * kPerLane, (g + 1) * kPerLane) of its token; experts at or past
/// num_experts are padding. vec_loads: the row pointer and stride allow loads of
/// load_width<T>(kPerLane) elements.
template <typename T, int kLanes, int kPerLane>
__global__ void __launch_bounds__(kFastThreads)
    topk_softmax_group_kernel(const Args<T> a, bool vec_loads) {
  pdl_prologue();
  constexpr int kLoad = load_width<T>(kPerLane);
  constexpr int kTokensPerBlock = kFastThreads / kLanes;
  using V = Vec<T, kLoad>;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int slot = static_cast<int>(threadIdx.x) / kLanes;
  const int64_t experts = a.num_experts;
  const int64_t first_id = static_cast<int64_t>(lane) * kPerLane;
  // Uniform across the block: every lane of a warp reaches every shuffle.
  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock; t0 < a.num_tokens;
       t0 += static_cast<int64_t>(gridDim.x) * kTokensPerBlock) {
    const int64_t t = t0 + slot;
    const bool valid = t < a.num_tokens;
    const T* row = a.gating + (valid ? t : 0) * a.row_stride + first_id;

    float x[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; j += kLoad) {
      if (vec_loads && valid && first_id + j + kLoad <= experts) {
        const V v = *reinterpret_cast<const V*>(row + j);
#pragma unroll
        for (int q = 0; q < kLoad; ++q) x[j + q] = to_float(v.v[q]);
      } else {
#pragma unroll
        for (int q = 0; q < kLoad; ++q) {
          x[j + q] = (valid && first_id + j + q < experts) ? to_float(row[j + q]) : neg_inf();
        }
      }
    }

    // Softmax in fp32. fmaxf skips NaN; padding is -inf and does not move the max.
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) m = fmaxf(m, x[j]);
#pragma unroll
    for (int mask = kLanes / 2; mask > 0; mask /= 2) m = fmaxf(m, APHRODITE_SHFL_XOR(m, mask));
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      x[j] = first_id + j < experts ? expf(x[j] - m) : 0.0f;
      sum += x[j];
    }
#pragma unroll
    for (int mask = kLanes / 2; mask > 0; mask /= 2) sum += APHRODITE_SHFL_XOR(sum, mask);
    Key keys[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      keys[j] = first_id + j < experts ? make_key(x[j] / sum, static_cast<uint32_t>(first_id + j))
                                       : Key{0};
    }

    // Top-k: round j takes the largest key below the previous round's.
    float w[kFastMaxK];
    int32_t ids[kFastMaxK];
    float w_sum = 0.0f;
    Key prev = ~Key{0};
#pragma unroll
    for (int j = 0; j < kFastMaxK; ++j) {
      if (j < a.k) {
        Key best = 0;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          if (keys[e] < prev) best = key_max(best, keys[e]);
        }
#pragma unroll
        for (int mask = kLanes / 2; mask > 0; mask /= 2) {
          best = key_max(best, APHRODITE_SHFL_XOR(best, mask));
        }
        prev = best;
        w[j] = key_prob(best);
        ids[j] = key_id(best);
        w_sum += w[j];
      }
    }

    if (valid) {
      const int64_t out0 = t * a.k;
#pragma unroll
      for (int j = 0; j < kFastMaxK; ++j) {
        if (j < a.k && j % kLanes == lane) {
          a.weights[out0 + j] = a.renormalize ? w[j] / w_sum : w[j];
          a.indices[out0 + j] = ids[j];
          a.token_expert_indices[out0 + j] = static_cast<int32_t>(j * a.num_tokens + t);
        }
      }
    }
  }
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct KeyMaxOp {
  __device__ Key operator()(Key a, Key b) const { return key_max(a, b); }
};

/// Reduces v over the block (blockDim.x a multiple of the warp size, blockDim.y == 1); every
/// thread gets the same result. Every thread of the block must call it.
template <typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, V* smem, Op op) {
  for (int mask = APHRODITE_WARP_SIZE / 2; mask > 0; mask /= 2) {
    v = op(v, APHRODITE_SHFL_XOR(v, mask));
  }
  const int warp = static_cast<int>(threadIdx.x) / APHRODITE_WARP_SIZE;
  const int lane = static_cast<int>(threadIdx.x) % APHRODITE_WARP_SIZE;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  V r = smem[0];
  const int num_warps = static_cast<int>(blockDim.x) / APHRODITE_WARP_SIZE;
  for (int i = 1; i < num_warps; ++i) r = op(r, smem[i]);
  __syncthreads();  // smem is reused by the next reduction
  return r;
}

/// Generic path: one block per token, any num_experts and k. Probabilities are recomputed from
/// the logits in every round (the row stays in L1/L2), so it needs no shared memory per expert.
template <typename T>
__global__ void __launch_bounds__(kGenericThreads) topk_softmax_block_kernel(const Args<T> a) {
  pdl_prologue();
  __shared__ float smem_f[32];
  __shared__ Key smem_k[32];
  const int64_t experts = a.num_experts;
  const int64_t step = blockDim.x;
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    const T* row = a.gating + t * a.row_stride;
    float m = neg_inf();
    for (int64_t e = threadIdx.x; e < experts; e += step) m = fmaxf(m, to_float(row[e]));
    m = block_reduce(m, smem_f, MaxOp());
    float sum = 0.0f;
    for (int64_t e = threadIdx.x; e < experts; e += step) sum += expf(to_float(row[e]) - m);
    sum = block_reduce(sum, smem_f, SumOp());

    const int64_t out0 = t * a.k;
    float w_sum = 0.0f;
    Key prev = ~Key{0};
    for (int64_t j = 0; j < a.k; ++j) {
      Key best = 0;
      for (int64_t e = threadIdx.x; e < experts; e += step) {
        const Key key = make_key(expf(to_float(row[e]) - m) / sum, static_cast<uint32_t>(e));
        if (key < prev) best = key_max(best, key);
      }
      best = block_reduce(best, smem_k, KeyMaxOp());
      prev = best;
      const float w = key_prob(best);
      w_sum += w;
      if (j % step == threadIdx.x) {
        a.weights[out0 + j] = w;
        a.indices[out0 + j] = key_id(best);
        a.token_expert_indices[out0 + j] = static_cast<int32_t>(j * a.num_tokens + t);
      }
    }
    if (a.renormalize) {
      // Each thread rescales the weights it wrote itself.
      for (int64_t j = threadIdx.x; j < a.k; j += step) {
        a.weights[out0 + j] = a.weights[out0 + j] / w_sum;
      }
    }
  }
}

template <typename T, int kLanes, int kPerLane>
gpuError_t launch_group(const Args<T>& a, gpuStream_t stream) {
  constexpr int kLoad = load_width<T>(kPerLane);
  const bool vec_loads = kLoad > 1 &&
                         reinterpret_cast<uintptr_t>(a.gating) % (kLoad * sizeof(T)) == 0 &&
                         a.row_stride % kLoad == 0;
  int64_t blocks = ceil_div(a.num_tokens, kFastThreads / kLanes);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  launch_kernel<topk_softmax_group_kernel<T, kLanes, kPerLane>>(
      static_cast<unsigned>(blocks), kFastThreads, 0, stream, a, vec_loads);
  return gpuGetLastError();
}

/// Launches the group kernel whose kPerLane (in [kPer, kMaxPer]) equals per_lane.
template <typename T, int kLanes, int kPer, int kMaxPer>
gpuError_t launch_group_per_lane(const Args<T>& a, int per_lane, gpuStream_t stream) {
  if constexpr (kPer > kMaxPer) {
    return gpuErrorInvalidValue;  // unreachable: the caller keeps per_lane in range
  } else {
    if (per_lane == kPer) return launch_group<T, kLanes, kPer>(a, stream);
    return launch_group_per_lane<T, kLanes, kPer + 1, kMaxPer>(a, per_lane, stream);
  }
}

template <typename T>
gpuError_t launch_block(const Args<T>& a, gpuStream_t stream) {
  // A multiple of 64 threads: whole warps on every vendor.
  int64_t threads = ceil_div(a.num_experts, 64) * 64;
  if (threads > kGenericThreads) threads = kGenericThreads;
  int64_t blocks = a.num_tokens;
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  launch_kernel<topk_softmax_block_kernel<T>>(static_cast<unsigned>(blocks),
                                              static_cast<unsigned>(threads), 0, stream, a);
  return gpuGetLastError();
}

template <typename T>
gpuError_t launch_typed(const TopkSoftmaxProblem& p, gpuStream_t stream) {
  if (p.num_tokens <= 0 || p.k <= 0) return gpuSuccess;
  if (p.num_experts <= 0 || p.k > p.num_experts || p.num_experts > INT32_MAX) {
    return gpuErrorInvalidValue;
  }
  Args<T> a;
  a.weights = p.topk_weights;
  a.indices = p.topk_indices;
  a.token_expert_indices = p.token_expert_indices;
  a.gating = static_cast<const T*>(p.gating);
  a.num_tokens = p.num_tokens;
  a.num_experts = p.num_experts;
  a.k = p.k;
  a.row_stride = p.gating_row_stride;
  a.renormalize = p.renormalize;
  if (p.num_experts > kFastMaxExperts || p.k > kFastMaxK) return launch_block<T>(a, stream);

  // Lanes per token: a power of two giving about kFastTargetPerLane experts per lane. That
  // leaves 1..8 experts per lane for one lane, 5..8 for 2..16 lanes, and 5..16 for 32 lanes.
  int lanes = 1;
  while (lanes < 32 && int64_t{lanes} * kFastTargetPerLane < p.num_experts) lanes *= 2;
  const int per_lane = static_cast<int>(ceil_div(p.num_experts, lanes));
  switch (lanes) {
    case 1: return launch_group_per_lane<T, 1, 1, 8>(a, per_lane, stream);
    case 2: return launch_group_per_lane<T, 2, 5, 8>(a, per_lane, stream);
    case 4: return launch_group_per_lane<T, 4, 5, 8>(a, per_lane, stream);
    case 8: return launch_group_per_lane<T, 8, 5, 8>(a, per_lane, stream);
    case 16: return launch_group_per_lane<T, 16, 5, 8>(a, per_lane, stream);
    default: return launch_group_per_lane<T, 32, 5, 16>(a, per_lane, stream);
  }
}

}  // namespace

/// @brief Launches topk_softmax on `stream` for the gating dtype p.gating_dtype: fp32 softmax of
/// each row, its k largest probabilities (descending, ties to the lower expert id, NaN ranked
/// below every number) with their expert ids, optionally renormalised to sum to 1. Returns the
/// launch's error code.
gpuError_t launch_topk_softmax(const TopkSoftmaxProblem& p, gpuStream_t stream) {
  switch (p.gating_dtype) {
    case ScalarType::kFloat32: return launch_typed<float>(p, stream);
    case ScalarType::kFloat16: return launch_typed<__half>(p, stream);
    case ScalarType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace aphrodite::moe
