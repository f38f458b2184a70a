// MoE output reduction: out[t, :] = sum over k of input[t, k, :], accumulated in fp32 and rounded
// once to the element type. Entry points for every backend. Torch-free.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::moe {

/// Strides in elements; the hidden dimension of both tensors is contiguous. The k terms are
/// added in ascending k.
struct MoeSumProblem {
  void* out;          ///< [num_tokens, hidden], row stride out_token_stride
  const void* input;  ///< [num_tokens, topk, hidden], strides in_token_stride, in_k_stride
  int64_t num_tokens;
  int64_t topk;
  int64_t hidden;
  int64_t out_token_stride;
  int64_t in_token_stride;
  int64_t in_k_stride;
  ScalarType dtype;
};

}  // namespace aphrodite::moe

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::moe {
/// @brief Launches moe_sum on `stream`; returns the launch's error code.
gpuError_t launch_moe_sum(const MoeSumProblem& p, gpuStream_t stream);
}  // namespace aphrodite::moe
#endif
