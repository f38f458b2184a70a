// Decode attention over a paged KV cache (one query token per sequence): paged_attention_v1
// (one pass), paged_attention_v2 (split over the context, then a reduce step) and the
// Transformer-XL relative-position variant. Entry points for every backend. Torch-free.
//
// The caches use the paged layout that reshape_and_cache writes (kernels/cache):
//   key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x], x = 16 / sizeof(elem)
//   value_cache [num_blocks, num_kv_heads, head_size, block_size]
// Sequence s's token j lives in block block_tables[s, j / block_size], slot j % block_size.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::attention {

/// How the KV cache stores its elements.
enum class KvCacheDtype : int8_t {
  kAuto = 0,     ///< the query's dtype
  kFp8E4M3 = 1,  ///< one byte each, value = fp8 * scale (kernels/common/fp8.h)
};

/// For query head h of sequence s (kv head h / (num_heads / num_kv_heads)), over its tokens
/// j < seq_lens[s]:
///   score_j = scale * ((q[s, h] + u[s, h]) . k[s, j]           (u = pos_bias_u, XL only)
///                      + matrix_bd[s, h, j])                     (XL only)
///           + alibi_slopes[h] * (j - seq_lens[s] + 1)            (when alibi_slopes is set)
/// (Transformer-XL: the content and position terms are summed, then scaled.)
///   out[s, h] = sum_j softmax(score)_j * v[s, j]
/// Softmax and accumulation in fp32. A sequence of length 0 gets zeros.
struct PagedAttentionProblem {
  void* out;              ///< [num_seqs, num_heads, head_size], contiguous
  const void* query;      ///< [num_seqs, num_heads, head_size], last dim contiguous
  const void* key_cache;  ///< see the layout above; strides below (elements)
  const void* value_cache;
  const int32_t* block_tables;  ///< [num_seqs, block_table_stride], row s holds s's blocks
  const int32_t* seq_lens;      ///< [num_seqs]
  const float* alibi_slopes;    ///< [num_heads], or nullptr
  const float* k_scale;         ///< one float on the kernel's device (fp8 caches; else unused)
  const float* v_scale;
  // Transformer-XL relative position (both nullptr for plain paged attention):
  const void* pos_bias_u;  ///< [num_seqs, num_heads, head_size] in the query's dtype
  const void* matrix_bd;   ///< [num_seqs, num_heads, >= max_seq_len] in the query's dtype
  int64_t num_seqs;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_size;
  int64_t block_size;
  int64_t max_seq_len;         ///< >= every seq_lens[s]; sizes the v2 partitions
  int64_t block_table_stride;  ///< elements between rows of block_tables
  int64_t block_table_width;   ///< columns of block_tables (read ahead up to it)
  int64_t q_seq_stride;        ///< elements between sequences of query (heads: head_size)
  int64_t q_head_stride;
  int64_t kv_block_stride;  ///< elements between blocks of key_cache and of value_cache
  int64_t kv_head_stride;   ///< elements between kv heads within a block
  int64_t u_seq_stride;     ///< pos_bias_u, like the query's
  int64_t u_head_stride;
  int64_t bd_seq_stride;  ///< matrix_bd: elements between sequences, between heads
  int64_t bd_head_stride;
  float scale;
  ScalarType dtype;  ///< of query, out, pos_bias_u, matrix_bd (and auto caches)
  KvCacheDtype cache_dtype;
};

/// The split-KV (v2) scratch: partition p of (s, h) covers tokens [p * partition_size, ...).
struct PagedAttentionV2Scratch {
  float* exp_sums;             ///< [num_seqs, num_heads, max_num_partitions]
  float* max_logits;           ///< [num_seqs, num_heads, max_num_partitions]
  float* tmp_out;              ///< [num_seqs, num_heads, max_num_partitions, head_size]
  int64_t max_num_partitions;  ///< >= ceil(max_seq_len / partition_size)
  int64_t partition_size;
};

}  // namespace aphrodite::attention

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::attention {
/// @brief Launches single-pass paged attention on `stream`; returns the launch's error code.
gpuError_t launch_paged_attention_v1(const PagedAttentionProblem& p, gpuStream_t stream);
/// @brief Launches split-KV paged attention and its reduce step on `stream`.
gpuError_t launch_paged_attention_v2(const PagedAttentionProblem& p,
                                     const PagedAttentionV2Scratch& scratch, gpuStream_t stream);
/// Why this build cannot launch `p` (v2 with `scratch`, v1 with nullptr), or nullptr when it
/// can: a head size, block size, dtype or cache dtype the generator options left out, caches
/// not 16-byte aligned, bad partitioning. Exactly then the launchers return an invalid-value
/// error; a binding calls this first to raise the reason (valid until the thread's next call).
const char* paged_attention_unsupported(const PagedAttentionProblem& p,
                                        const PagedAttentionV2Scratch* scratch);
/// The warps of the tensor-core kernel's blocks that this build can run (dtype, cache dtype,
/// head size, block size) problems with, XL (`xl`) or plain, on the current device: 8 where its
/// wide blocks fit too, 4 where only its 4-warp ones do, 0 where such problems run in the
/// staged kernel or were not built. (A launch takes 8 where its grid leaves SMs to spare.)
int paged_attention_mma_warps(ScalarType dtype, KvCacheDtype cache_dtype, int64_t head_size,
                              int64_t block_size, bool xl);
}  // namespace aphrodite::attention
#endif
