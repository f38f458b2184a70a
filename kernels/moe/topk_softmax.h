// MoE routing: softmax over each token's expert logits, then its top-k experts.
// Entry points for every backend. Torch-free.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::moe {

/// For each token t: p = softmax(gating[t, :]) in fp32; the k largest entries of p (ties go to
/// the lower expert id) give topk_indices[t, j] (descending by p) and topk_weights[t, j] = p;
/// with renormalize the k weights are divided by their sum. token_expert_indices[t, j] =
/// j * num_tokens + t. Ids in a row are always distinct and in [0, num_experts), NaN/Inf logits
/// included.
struct TopkSoftmaxProblem {
  float* topk_weights;            ///< [num_tokens, k], contiguous
  int32_t* topk_indices;          ///< [num_tokens, k], contiguous
  int32_t* token_expert_indices;  ///< [num_tokens, k], contiguous
  const void* gating;             ///< [num_tokens, num_experts], row stride gating_row_stride
  int64_t num_tokens;
  int64_t num_experts;
  int64_t k;
  int64_t gating_row_stride;
  bool renormalize;
  ScalarType gating_dtype;
};

}  // namespace aphrodite::moe

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::moe {
/// @brief Launches topk_softmax on `stream`; returns the launch's error code.
gpuError_t launch_topk_softmax(const TopkSoftmaxProblem& p, gpuStream_t stream);
}  // namespace aphrodite::moe
#endif
