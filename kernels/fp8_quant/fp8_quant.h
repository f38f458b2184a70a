// FP8 E4M3 quantization of activations: with a given per-tensor scale (static), with a
// per-tensor scale computed from the input (dynamic), and with one scale per token (row).
// Every op stores result = e4m3(input / scale): an fp32 division, then kernels/common/fp8.h's
// conversion (round to nearest even, saturating to +-448). Torch-free.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::fp8_quant {

/// The largest finite E4M3 value, the target of the dynamic scales.
constexpr float kFp8Max = 448.0f;

/// The smallest per-token scale, as vLLM's per-token kernel: a token of (near) zeros gets
/// 1 / (448 * 512) instead of a scale that would divide by zero.
constexpr float kMinPerTokenScale = 1.0f / (kFp8Max * 512.0f);

/// One quantization problem: rows of `hidden` elements, each row's elements contiguous.
/// - static:    reads scale[0].
/// - dynamic:   writes scale[0] = max|input| / 448, then quantizes with it. For an input whose
///              max is 0 (all zeros), scale[0] = 0 is written (dequantizing gives the zeros
///              back) and the elements are divided by 1 instead, so nothing divides by zero.
/// - per token: writes scale[t] = max(min(max|input[t, :]|, scale_ub[0]) / 448,
///              kMinPerTokenScale) for every row t, then quantizes row t with it.
/// Values beyond +-448 * scale saturate to +-448.
struct QuantProblem {
  uint8_t* out;           ///< [num_tokens, hidden] E4M3 bytes, row stride out_row_stride
  const void* input;      ///< [num_tokens, hidden] of dtype, row stride input_row_stride
  float* scale;           ///< [1] (static: read only, dynamic: written) or [num_tokens]
  const float* scale_ub;  ///< per token: [1] upper bound of a row's max, or null for none
  float* workspace;       ///< dynamic: dynamic_scaled_fp8_quant_workspace(p) floats, or null
  int64_t num_tokens;
  int64_t hidden;
  int64_t out_row_stride;    ///< elements (bytes) between rows of out
  int64_t input_row_stride;  ///< elements between rows of input
  ScalarType dtype;          ///< of input
};

}  // namespace aphrodite::fp8_quant

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::fp8_quant {
/// @brief Launches out = e4m3(input / scale[0]) on `stream`; returns the launch's error code.
gpuError_t launch_static_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream);
/// Floats of device scratch (per-block maxima) launch_dynamic_scaled_fp8_quant needs for p;
/// 0 where it runs as one kernel.
int64_t dynamic_scaled_fp8_quant_workspace(const QuantProblem& p);
/// @brief Launches the per-tensor max reduction and the quantization with its scale on
/// `stream` (two kernels, or one for small inputs; no host synchronisation); returns the
/// launches' error code. p.workspace must hold dynamic_scaled_fp8_quant_workspace(p) floats.
gpuError_t launch_dynamic_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream);
/// @brief Launches the per-token scale computation and quantization (one kernel) on `stream`;
/// returns the launch's error code.
gpuError_t launch_dynamic_per_token_scaled_fp8_quant(const QuantProblem& p, gpuStream_t stream);
}  // namespace aphrodite::fp8_quant
#endif
