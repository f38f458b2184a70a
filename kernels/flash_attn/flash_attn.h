// Flash attention (FA2-style forward) over packed variable-length batches. Torch-free: raw
// pointers, sizes, strides in elements and a stream.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::flash_attn {

/// out[t, h, :] = softmax(score(q[t, h, :], k[s, kvh, :])) v[s, kvh, :] over the keys s that t
/// sees in its sequence, kvh = h / (num_heads / num_kv_heads), score = scale * q . k, or with a
/// softcap c > 0, c * tanh(scale * q . k / c). Sequence b owns query rows [cu_seqlens_q[b],
/// cu_seqlens_q[b+1]) and sk = seqused_k[b] keys (cu_seqlens_k[b+1] - cu_seqlens_k[b] without
/// seqused_k): dense keys are rows cu_seqlens_k[b] + j of k/v; paged keys (block_table set) are
/// rows k[block_table[b][j / block_size], j % block_size]. Query i of a sequence sits at key
/// position i + sk - sq (bottom-right alignment) and sees keys j with
/// pos - window_left <= j <= pos + window_right (-1: that side unbounded; causal: right = 0).
/// A query row that sees no key gets a zero output and an LSE of -inf.
struct FwdProblem {
  const void* q;  ///< [total_q, num_heads, head_dim]
  const void* k;  ///< [total_k, num_kv_heads, head_dim], paged [blocks, block_size, ditto]
  const void* v;  ///< shaped as k
  void* out;      ///< [total_q, num_heads, head_dim]
  float* lse;     ///< [num_heads, total_q] contiguous, or nullptr
  const int32_t* cu_seqlens_q;  ///< [batch + 1], on the device
  const int32_t* cu_seqlens_k;  ///< [batch + 1], on the device
  const int32_t* seqused_k;     ///< [batch] key counts, or nullptr (cu_seqlens_k gives them)
  /// [batch, >= ceil(sk / block_size)] cache blocks of each sequence, or nullptr (dense k/v).
  /// Entries past a sequence's last key are never read; the others must be valid block indices.
  const int32_t* block_table;
  int64_t block_table_batch_stride;
  int64_t k_block_stride, v_block_stride;  ///< paged: the caches' block strides
  // Strides in elements; the last dim is contiguous. Rows and heads must be 16-byte aligned.
  // Paged: k/v row and head strides are those of the cache's dims 1 and 2.
  int64_t q_row_stride, q_head_stride;
  int64_t k_row_stride, k_head_stride;
  int64_t v_row_stride, v_head_stride;
  int64_t o_row_stride, o_head_stride;
  int64_t total_q;  ///< the LSE's row length
  int batch;
  int num_heads;
  int num_kv_heads;  ///< divides num_heads
  int head_dim;
  int max_seqlen_q;  ///< >= every sequence's query length (sizes the grid)
  int block_size;    ///< paged: keys per cache block, a multiple of 16
  /// Set by the launch from block_size (callers leave them): the constants of the kernel's
  /// division by block_size (a multiply-high, an add and a shift; see common/fast_div.h).
  uint32_t block_size_mul, block_size_shift;
  int window_left;      ///< >= 0, or -1: unbounded
  int window_right;     ///< >= 0, or -1: unbounded; ignored (0) when causal
  float softmax_scale;  ///< > 0
  float softcap;        ///< > 0: tanh softcapping of the scores; 0: none
  bool causal;
  ScalarType dtype;  ///< of q, k, v and out: float16 or bfloat16
};

}  // namespace aphrodite::flash_attn

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::flash_attn {
/// @brief Whether this build holds the instantiation for (head_dim, dtype, causal, paged).
bool has_fwd(int head_dim, ScalarType dtype, bool causal, bool paged);
/// @brief The head dims this build was generated for, as text ("64, 128"), for messages.
const char* built_head_dims();
/// @brief Launches the forward on `stream`; returns the launch's error code
/// (gpuErrorInvalidValue for an instantiation this build lacks).
gpuError_t launch_fwd(const FwdProblem& p, gpuStream_t stream);
}  // namespace aphrodite::flash_attn
#endif
