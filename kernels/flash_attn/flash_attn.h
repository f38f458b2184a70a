// Flash attention (FA2-style forward) over packed variable-length batches. Torch-free: raw
// pointers, sizes, strides in elements and a stream.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::flash_attn {

/// out[t, h, :] = softmax(scale * q[t, h, :] . k[s, kvh, :]^T) v[s, kvh, :] over the keys s of
/// t's sequence, kvh = h / (num_heads / num_kv_heads). Sequence b owns query rows
/// [cu_seqlens_q[b], cu_seqlens_q[b+1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1]).
/// Causal masks are bottom-right aligned: query i of a sequence sees keys j <= i + sk - sq. A
/// query row that sees no key gets a zero output and an LSE of -inf.
struct FwdProblem {
  const void* q;                ///< [total_q, num_heads, head_dim]
  const void* k;                ///< [total_k, num_kv_heads, head_dim]
  const void* v;                ///< [total_k, num_kv_heads, head_dim]
  void* out;                    ///< [total_q, num_heads, head_dim]
  float* lse;                   ///< [num_heads, total_q] contiguous, or nullptr
  const int32_t* cu_seqlens_q;  ///< [batch + 1], on the device
  const int32_t* cu_seqlens_k;  ///< [batch + 1], on the device
  // Strides in elements; the last dim is contiguous. Rows and heads must be 16-byte aligned.
  int64_t q_row_stride, q_head_stride;
  int64_t k_row_stride, k_head_stride;
  int64_t v_row_stride, v_head_stride;
  int64_t o_row_stride, o_head_stride;
  int64_t total_q;  ///< the LSE's row length
  int batch;
  int num_heads;
  int num_kv_heads;  ///< divides num_heads
  int head_dim;
  int max_seqlen_q;     ///< >= every sequence's query length (sizes the grid)
  float softmax_scale;  ///< > 0
  bool causal;
  ScalarType dtype;  ///< of q, k, v and out: float16 or bfloat16
};

}  // namespace aphrodite::flash_attn

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::flash_attn {
/// @brief Whether this build holds the instantiation for (head_dim, dtype, causal).
bool has_fwd(int head_dim, ScalarType dtype, bool causal);
/// @brief The head dims this build was generated for, as text ("64, 128"), for messages.
const char* built_head_dims();
/// @brief Launches the forward on `stream`; returns the launch's error code
/// (gpuErrorInvalidValue for an instantiation this build lacks).
gpuError_t launch_fwd(const FwdProblem& p, gpuStream_t stream);
}  // namespace aphrodite::flash_attn
#endif
