// Gated activations: out[t, i] = act(x[t, i]) * x[t, d + i]. Entry points for every backend.
// Torch-free: raw pointers, sizes, strides and a stream.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::activation {

/// The activation applied to the first half of each input row.
enum class Kind : int8_t {
  kSilu = 0,      ///< x * sigmoid(x)
  kGelu = 1,      ///< 0.5 * x * (1 + erf(x / sqrt(2)))
  kGeluTanh = 2,  ///< 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))
};

/// One act-and-mul problem. Rows may be strided; the last dimension is contiguous.
struct Problem {
  void* out;          ///< [num_tokens, d], row stride out_row_stride (elements)
  const void* input;  ///< [num_tokens, 2 * d], row stride input_row_stride (elements)
  int64_t num_tokens;
  int64_t d;
  int64_t out_row_stride;
  int64_t input_row_stride;
  ScalarType dtype;  ///< of out and input alike
};

}  // namespace aphrodite::activation

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::activation {
/// @brief Launches act(x[:, :d]) * x[:, d:] on `stream`. Returns the launch's error code.
/// Implemented by the generated dispatch (codegen/activation.py).
gpuError_t launch_act_and_mul(Kind kind, const Problem& p, gpuStream_t stream);

/// Whether this build holds the instantiation for (kind, dtype); a build profile may narrow
/// the generated grid.
bool has_act_and_mul(Kind kind, ScalarType dtype);

/// One instantiation: T is float, __half or __nv_bfloat16 and matches p.dtype. Defined in
/// activation_kernels.cuh; each generated file instantiates one (K, T).
template <Kind K, typename T>
gpuError_t act_and_mul_launch(const Problem& p, gpuStream_t stream);
}  // namespace aphrodite::activation
#endif
