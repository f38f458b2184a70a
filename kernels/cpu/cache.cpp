// CPU kernels of the KV cache family (kernels/cache/cache.h): reshape_and_cache in both layouts
// and copy_blocks. kAuto caches hold the input's own bits, so those paths are copies; fp8
// caches convert in fp32 vectors and encode them with cpu/fp8.h (the host twin of
// kernels/common/fp8.h). Compiled once per ISA (see vec.h).
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "cpu/fp8.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

/// dst[j * dst_stride] = e4m3(src[j] * inv_scale) for j < n.
template <ScalarType T>
void quantize_row(uint8_t* dst, int64_t dst_stride, const vec::storage_t<T>* src, int64_t n,
                  float inv_scale) {
  constexpr int L = vec::kLanes;
  const vf s = vec::bcast(inv_scale);
  for (int64_t i = 0; i < n; i += L) {
    const int64_t m = n - i < L ? n - i : L;
    const vf v = (m == L ? vec::load<T>(src + i) : vec::load_partial<T>(src + i, m)) * s;
    if (dst_stride == 1) {
      fp8::store_bytes(dst + i, fp8::e4m3_bits(v), m);
    } else {
      fp8::store_bytes_strided(dst + i * dst_stride, dst_stride, fp8::e4m3_bits(v), m);
    }
  }
}

/// Writes one (token, head) row of `n` elements: `x` contiguous rows of a paged key (chunks of
/// x elements, chunk_stride apart), a flash row (x = n), or a paged value (x = 1,
/// chunk_stride = block_size). `out` points at element 0 of the row's place in the cache.
/// kAuto caches come here for the flash layout only.
template <ScalarType T>
void write_row(const cache::ReshapeAndCacheProblem& p, void* out, const void* in, int64_t x,
               int64_t chunk_stride, float inv_scale) {
  using S = vec::storage_t<T>;
  const int64_t n = p.head_size;
  const S* src = static_cast<const S*>(in);
  if (p.cache_dtype == cache::KvCacheDtype::kAuto) {  // a flash row (paged: paged_auto_run)
    std::memcpy(out, src, sizeof(S) * n);
    return;
  }
  uint8_t* dst = static_cast<uint8_t*>(out);
  if (x == 1) {
    quantize_row<T>(dst, chunk_stride, src, n, inv_scale);
  } else {
    for (int64_t c = 0; c * x < n; ++c) {
      quantize_row<T>(dst + c * chunk_stride, 1, src + c * x, x, inv_scale);
    }
  }
}

typedef uint16_t v8x16 __attribute__((vector_size(16)));
typedef uint32_t v4x32 __attribute__((vector_size(16)));
typedef uint64_t v2x64 __attribute__((vector_size(16)));

/// Interleaves the low (Hi = false) or high halves of a and b in units of U.
template <typename U, bool Hi>
APHRODITE_VEC_INLINE v4x32 interleave(v4x32 a, v4x32 b) {
  if constexpr (sizeof(U) == 2) {
    const v8x16 x = (v8x16)a, y = (v8x16)b;
    if constexpr (Hi) return (v4x32)__builtin_shufflevector(x, y, 4, 12, 5, 13, 6, 14, 7, 15);
    return (v4x32)__builtin_shufflevector(x, y, 0, 8, 1, 9, 2, 10, 3, 11);
  } else if constexpr (sizeof(U) == 4) {
    if constexpr (Hi) return __builtin_shufflevector(a, b, 2, 6, 3, 7);
    return __builtin_shufflevector(a, b, 0, 4, 1, 5);
  } else {
    const v2x64 x = (v2x64)a, y = (v2x64)b;
    if constexpr (Hi) return (v4x32)__builtin_shufflevector(x, y, 1, 3);
    return (v4x32)__builtin_shufflevector(x, y, 0, 2);
  }
}

/// One stage of a W x W transpose in units of U: within each group of G rows, rows i and
/// i + G/2 become rows 2i and 2i + 1 (their low and high interleavings).
template <typename U, int W, int G>
APHRODITE_VEC_INLINE void transpose_stage(v4x32 (&r)[W]) {
  v4x32 o[W];
  for (int base = 0; base < W; base += G) {
    for (int i = 0; i < G / 2; ++i) {
      o[base + 2 * i] = interleave<U, false>(r[base + i], r[base + i + G / 2]);
      o[base + 2 * i + 1] = interleave<U, true>(r[base + i], r[base + i + G / 2]);
    }
  }
  for (int i = 0; i < W; ++i) r[i] = o[i];
}

/// dst[c * dst_stride + j] = src[j][c] for j, c < W, W = 16 / sizeof(E) (a 16-byte row from
/// each of W sources, transposed).
template <typename E>
APHRODITE_VEC_INLINE void transpose_tile(E* dst, int64_t dst_stride, const E* const* src) {
  constexpr int W = 16 / sizeof(E);
  v4x32 r[W];
  for (int j = 0; j < W; ++j) std::memcpy(&r[j], src[j], 16);
  // log2(W) stages, units and groups doubling, leave row c holding column c.
  if constexpr (W == 8) {
    transpose_stage<uint16_t, 8, 2>(r);
    transpose_stage<uint32_t, 8, 4>(r);
    transpose_stage<uint64_t, 8, 8>(r);
  } else {
    transpose_stage<uint32_t, 4, 2>(r);
    transpose_stage<uint64_t, 4, 4>(r);
  }
  for (int c = 0; c < W; ++c) std::memcpy(dst + c * dst_stride, &r[c], 16);
}

/// The paged layout for a kAuto cache, tokens [t0, t0 + n) going to the consecutive slots
/// [o0, o0 + n) of one block: each 16-byte key chunk c of those tokens fills one contiguous run
/// of the block's chunk c, and the values are transposed so that row d of the block gets n
/// contiguous elements. A token-by-token scatter would write each value element alone, block_size
/// elements apart.
/// The most tokens paged_auto_run takes at once.
constexpr int64_t kMaxRun = 64;

template <ScalarType T>
void paged_auto_run(const cache::ReshapeAndCacheProblem& p, int64_t t0, int64_t n, int64_t block,
                    int64_t o0) {
  using S = vec::storage_t<T>;
  constexpr int64_t kChunkBytes = 16;
  constexpr int64_t x = kChunkBytes / sizeof(S);  // cache::paged_key_chunk for kAuto
  const int64_t bs = p.block_size;
  const int64_t hs = p.head_size;
  for (int64_t h = 0; h < p.num_kv_heads; ++h) {
    const S* k[kMaxRun];
    const S* v[kMaxRun];
    for (int64_t j = 0; j < n; ++j) {
      k[j] = static_cast<const S*>(p.key) + (t0 + j) * p.key_token_stride + h * p.key_head_stride;
      v[j] = static_cast<const S*>(p.value) + (t0 + j) * p.value_token_stride +
             h * p.value_head_stride;
    }
    S* kd = static_cast<S*>(p.key_cache) + block * p.key_cache_block_stride +
            h * p.key_cache_head_stride + o0 * x;
    for (int64_t c = 0; c < hs / x; ++c) {
      S* dst = kd + c * bs * x;
      for (int64_t j = 0; j < n; ++j) std::memcpy(dst + j * x, k[j] + c * x, kChunkBytes);
    }
    S* vd = static_cast<S*>(p.value_cache) + block * p.value_cache_block_stride +
            h * p.value_cache_head_stride + o0;
    // x x x tiles (x = the elements of 16 bytes; head_size is a multiple of x).
    int64_t j0 = 0;
    for (; j0 + x <= n; j0 += x) {
      const S* rows[x];
      for (int64_t d0 = 0; d0 < hs; d0 += x) {
        for (int64_t j = 0; j < x; ++j) rows[j] = v[j0 + j] + d0;
        transpose_tile<S>(vd + d0 * bs + j0, bs, rows);
      }
    }
    for (int64_t d = 0; d < hs && j0 < n; ++d) {
      S* dst = vd + d * bs;
      for (int64_t j = j0; j < n; ++j) dst[j] = v[j][d];
    }
  }
}

template <ScalarType T>
void reshape_and_cache_rows(const cache::ReshapeAndCacheProblem& p, int64_t token_begin,
                            int64_t token_end) {
  const int64_t elem = p.cache_dtype == cache::KvCacheDtype::kAuto
                           ? static_cast<int64_t>(sizeof(vec::storage_t<T>))
                           : 1;
  const int64_t in_elem = sizeof(vec::storage_t<T>);
  const bool flash = p.layout == cache::CacheLayout::kFlash;
  const int64_t x = cache::paged_key_chunk(p.cache_dtype, p.dtype);
  float inv_k = 1.0f, inv_v = 1.0f;
  if (p.cache_dtype != cache::KvCacheDtype::kAuto) {
    inv_k = 1.0f / *p.k_scale;
    inv_v = 1.0f / *p.v_scale;
  }
  const auto* key = static_cast<const char*>(p.key);
  const auto* value = static_cast<const char*>(p.value);
  auto* key_cache = static_cast<char*>(p.key_cache);
  auto* value_cache = static_cast<char*>(p.value_cache);
  for (int64_t t = token_begin; t < token_end; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || slot >= p.num_slots) continue;  // padding (the binding rejects the rest)
    const int64_t block = slot / p.block_size;
    const int64_t offset = slot - block * p.block_size;
    if (!flash && p.cache_dtype == cache::KvCacheDtype::kAuto) {
      // The run of following tokens that fill the next slots of the same block (prefill).
      int64_t n = 1;
      while (n < kMaxRun && t + n < token_end && offset + n < p.block_size &&
             p.slot_mapping[t + n] == slot + n) {
        ++n;
      }
      paged_auto_run<T>(p, t, n, block, offset);
      t += n - 1;
      continue;
    }
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      const char* k = key + (t * p.key_token_stride + h * p.key_head_stride) * in_elem;
      const char* v = value + (t * p.value_token_stride + h * p.value_head_stride) * in_elem;
      if (flash) {
        char* kd = key_cache + (block * p.key_cache_block_stride +
                                offset * p.key_cache_slot_stride + h * p.key_cache_head_stride) *
                                   elem;
        char* vd =
            value_cache + (block * p.value_cache_block_stride + offset * p.value_cache_slot_stride +
                           h * p.value_cache_head_stride) *
                              elem;
        write_row<T>(p, kd, k, p.head_size, 0, inv_k);
        write_row<T>(p, vd, v, p.head_size, 0, inv_v);
      } else {
        char* kd =
            key_cache +
            (block * p.key_cache_block_stride + h * p.key_cache_head_stride + offset * x) * elem;
        char* vd =
            value_cache +
            (block * p.value_cache_block_stride + h * p.value_cache_head_stride + offset) * elem;
        write_row<T>(p, kd, k, x, p.block_size * x, inv_k);
        write_row<T>(p, vd, v, 1, p.block_size, inv_v);
      }
    }
  }
}

}  // namespace

void reshape_and_cache(const cache::ReshapeAndCacheProblem& p, int64_t token_begin,
                       int64_t token_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32:
      reshape_and_cache_rows<ScalarType::kFloat32>(p, token_begin, token_end);
      break;
    case ScalarType::kFloat16:
      reshape_and_cache_rows<ScalarType::kFloat16>(p, token_begin, token_end);
      break;
    case ScalarType::kBFloat16:
      reshape_and_cache_rows<ScalarType::kBFloat16>(p, token_begin, token_end);
      break;
  }
}

void copy_blocks(const cache::CopyBlocksProblem& p, int64_t item_begin, int64_t item_end) {
  // Item i: pair i % num_pairs of layer (i / num_pairs) / 2, keys then values.
  for (int64_t i = item_begin; i < item_end; ++i) {
    const int64_t pair = i % p.num_pairs;
    const int64_t layer = i / p.num_pairs / 2;
    const bool is_value = (i / p.num_pairs) % 2 == 1;
    char* base = static_cast<char*>(is_value ? p.value_caches[layer] : p.key_caches[layer]);
    const int64_t stride = is_value ? p.value_block_stride_bytes : p.key_block_stride_bytes;
    const int64_t bytes = is_value ? p.value_block_bytes : p.key_block_bytes;
    const int64_t src = p.block_mapping[2 * pair], dst = p.block_mapping[2 * pair + 1];
    std::memcpy(base + dst * stride, base + src * stride, bytes);
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
