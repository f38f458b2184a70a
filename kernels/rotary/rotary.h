// Rotary position embedding (RoPE) applied in place to query and key. Entry points for every
// backend. Torch-free: raw pointers, sizes, strides (in elements) and a stream.
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

namespace aphrodite::rotary {

/// For each token t with position p = positions[t], and each head of query (and key), the first
/// rot_dim elements x of the head are rotated by the angles of row p of cos_sin_cache
/// (cos = row[0, rot_dim / 2), sin = row[rot_dim / 2, rot_dim)), in fp32, rounded once:
///   is_neox (halves):       x[i], x[i + rot_dim / 2]  ->  x[i] cos[i] - x[i + h] sin[i],
///                                                         x[i + h] cos[i] + x[i] sin[i]
///   GPT-J (interleaved):    x[2i], x[2i + 1]          ->  x[2i] cos[i] - x[2i + 1] sin[i],
///                                                         x[2i + 1] cos[i] + x[2i] sin[i]
/// Elements [rot_dim, head_size) of each head are neither read nor written.
struct RotaryProblem {
  const void* positions;      ///< [num_tokens] int64 or int32, stride positions_stride
  void* query;                ///< [num_tokens, num_heads, head_size], strides below
  void* key;                  ///< [num_tokens, num_kv_heads, head_size], or nullptr
  const void* cos_sin_cache;  ///< [max_position, rot_dim], row stride cache_stride
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;  ///< 0 when key is nullptr
  int64_t head_size;
  int64_t rot_dim;       ///< even, 2 <= rot_dim <= head_size
  int64_t max_position;  ///< rows of cos_sin_cache
  int64_t positions_stride;
  int64_t query_token_stride;
  int64_t query_head_stride;
  int64_t key_token_stride;
  int64_t key_head_stride;
  int64_t cache_stride;
  bool is_neox;
  bool positions_int32;    ///< positions are int32 (else int64)
  ScalarType dtype;        ///< of query and key
  ScalarType cache_dtype;  ///< dtype or kFloat32
};

}  // namespace aphrodite::rotary

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::rotary {
/// @brief Launches rotary_embedding on `stream`; returns the launch's error code. Positions
/// outside [0, max_position) are not checked on the host (that would need a device sync): the
/// kernel leaves those tokens' query and key unchanged and never reads outside the cache.
gpuError_t launch_rotary_embedding(const RotaryProblem& p, gpuStream_t stream);
}  // namespace aphrodite::rotary
#endif
