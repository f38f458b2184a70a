// RMS normalisation, plain and fused with the residual add. Entry points for every backend.
// Torch-free: raw pointers, sizes, strides and a stream.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::layernorm {

/// out[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + epsilon) * weight, computed in fp32.
struct RmsNormProblem {
  void* out;           ///< [num_tokens, hidden], row stride out_row_stride (elements)
  const void* input;   ///< [num_tokens, hidden], row stride input_row_stride (elements)
  const void* weight;  ///< [hidden], contiguous
  int64_t num_tokens;
  int64_t hidden;
  int64_t out_row_stride;
  int64_t input_row_stride;
  float epsilon;
  ScalarType dtype;  ///< of out, input and weight alike
};

/// residual[t, :] = input[t, :] + residual[t, :] (rounded to dtype), then
/// input[t, :] = rms_norm(residual[t, :]) * weight. Both tensors are updated in place.
struct FusedAddRmsNormProblem {
  void* input;         ///< [num_tokens, hidden], row stride input_row_stride (elements)
  void* residual;      ///< [num_tokens, hidden], row stride residual_row_stride
  const void* weight;  ///< [hidden], contiguous
  int64_t num_tokens;
  int64_t hidden;
  int64_t input_row_stride;
  int64_t residual_row_stride;
  float epsilon;
  ScalarType dtype;
};

}  // namespace aphrodite::layernorm

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::layernorm {
/// @brief Launches rms_norm on `stream`; returns the launch's error code.
gpuError_t launch_rms_norm(const RmsNormProblem& p, gpuStream_t stream);
/// @brief Launches fused_add_rms_norm on `stream`; returns the launch's error code.
gpuError_t launch_fused_add_rms_norm(const FusedAddRmsNormProblem& p, gpuStream_t stream);
}  // namespace aphrodite::layernorm
#endif
