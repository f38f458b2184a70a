// The paged KV cache: writing new keys and values into it (reshape_and_cache, in the paged
// layout that kernels/attention reads or in the flash layout) and copying whole blocks within a
// cache (copy_blocks). Entry points for every backend. Torch-free.
//
// Layouts, per layer (x = 16 / sizeof(cache element): 8 for 16-bit caches, 16 for fp8, 4 for
// fp32, so that a key chunk of x elements is one 16-byte vector):
//   paged: key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]
//          value_cache [num_blocks, num_kv_heads, head_size, block_size]
//   flash: key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_size]
// Token t goes to slot_mapping[t] = block * block_size + offset; a negative slot is padding and
// is skipped.
#pragma once

#include <cstdint>

#include "attention/paged_attention.h"
#include "common/scalar_type.h"

namespace aphrodite::cache {

/// How the KV cache stores its elements (the type paged attention reads).
using KvCacheDtype = attention::KvCacheDtype;

enum class CacheLayout : int8_t {
  kPaged = 0,  ///< key [blocks, heads, head_size / x, block_size, x], value [.., head_size, bs]
  kFlash = 1,  ///< key and value [blocks, block_size, heads, head_size]
};

/// Cache elements per 16-byte key chunk of the paged layout.
constexpr int64_t paged_key_chunk(KvCacheDtype cache_dtype, ScalarType dtype) {
  return cache_dtype == KvCacheDtype::kFp8E4M3 ? 16 : (dtype == ScalarType::kFloat32 ? 4 : 8);
}

/// For each token t with slot s = slot_mapping[t] >= 0 (block b = s / block_size, offset
/// o = s % block_size) and each kv head h, stores key[t, h, :] and value[t, h, :] at (b, h, o)
/// of the caches: copied unchanged for KvCacheDtype::kAuto, as fp8(x * (1 / scale)) for fp8
/// caches (kernels/common/fp8.h rounding). Every other cache element is left untouched.
struct ReshapeAndCacheProblem {
  const void* key;    ///< [num_tokens, num_kv_heads, head_size], last dim contiguous
  const void* value;  ///< same shape, its own strides
  void* key_cache;    ///< in `layout`, strides below (elements)
  void* value_cache;
  const int64_t* slot_mapping;  ///< [num_tokens], contiguous
  const float* k_scale;         ///< one float on the kernel's device (fp8 caches; else unused)
  const float* v_scale;
  int64_t num_tokens;
  int64_t num_kv_heads;
  int64_t head_size;
  int64_t block_size;
  int64_t num_slots;         ///< num_blocks * block_size: slots at or past it are not written
  int64_t key_token_stride;  ///< key: elements between tokens, between heads
  int64_t key_head_stride;
  int64_t value_token_stride;
  int64_t value_head_stride;
  /// Cache strides (elements). Paged: between blocks and heads; within a head the layout above
  /// is contiguous. Flash: between blocks, slots (offsets) and heads; head_size contiguous.
  int64_t key_cache_block_stride;
  int64_t key_cache_head_stride;
  int64_t key_cache_slot_stride;  ///< flash only
  int64_t value_cache_block_stride;
  int64_t value_cache_head_stride;
  int64_t value_cache_slot_stride;  ///< flash only
  CacheLayout layout;
  ScalarType dtype;  ///< of key and value (and of kAuto caches)
  KvCacheDtype cache_dtype;
};

/// For each layer l and each row (src, dst) of block_mapping, copies block src of key cache l
/// to block dst of it, and likewise for value cache l. Blocks are byte ranges: block i of a
/// cache starts at base + i * block_stride_bytes and spans block_bytes. Destination blocks must
/// be distinct and not sources of other rows (the copies run concurrently).
struct CopyBlocksProblem {
  /// [num_layers] base pointers of the key caches, then of the value caches. On the GPU these
  /// arrays live in device memory.
  void* const* key_caches;
  void* const* value_caches;
  const int64_t* block_mapping;  ///< [num_pairs, 2] (src, dst), contiguous
  int64_t num_layers;
  int64_t num_pairs;
  int64_t key_block_bytes;
  int64_t key_block_stride_bytes;
  int64_t value_block_bytes;
  int64_t value_block_stride_bytes;
  /// The largest power of two (<= 16) dividing every base pointer, block size and block stride:
  /// the width of the copies.
  int alignment;
};

}  // namespace aphrodite::cache

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::cache {
/// @brief Launches reshape_and_cache (either layout) on `stream`; returns the launch's error
/// code. fp8 caches need CUDA (kernels/common/fp8.h); on ROCm they return an invalid-value error.
gpuError_t launch_reshape_and_cache(const ReshapeAndCacheProblem& p, gpuStream_t stream);
/// @brief Launches copy_blocks for every layer in one kernel on `stream`.
gpuError_t launch_copy_blocks(const CopyBlocksProblem& p, gpuStream_t stream);
}  // namespace aphrodite::cache
#endif
