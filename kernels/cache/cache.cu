// GPU kernels of the KV cache family (cache.h).
//
// reshape_and_cache: a block takes a tile of up to 32 tokens of one kv head and moves it (at
// small sizes, 64-thread blocks share the items of a tile, one item each)
//   - keys (and flash values) in 16-byte cache chunks, chunk index fastest: a warp reads whole
//     input rows and writes whole sectors (paged keys of two neighbouring slots are adjacent);
//   - paged values, whose elements sit block_size apart in the cache, with the token index
//     fastest: each lane reads a 16-byte piece of one token's row and stores its elements one
//     by one, so that a warp's stores of one element index land on consecutive slots; at
//     decode sizes (16-bit inputs) in token groups instead, a warp on up to 8 tokens x a few
//     consecutive head elements each (reshape_and_cache_one_step_kernel, kValueRows).
// A thread takes a key item and a value item per step and loads both inputs and their slots
// before storing (no shared memory, no barrier: at decode sizes the kernel is one round of
// loads and a store); power-of-two block sizes split slots with a shift. Where a thread has at
// most one item and every offset fits an int (decode sizes), a loop-free 32-bit form runs.
// Misaligned inputs take the same kernels with element-wise accesses. copy_blocks: one block
// per (pair, layer, key|value), copying with the widest access the alignment allows.
// Torch-free.
#include "cache/cache.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#if !defined(USE_ROCM)
#include "common/fp8.h"
#endif

namespace aphrodite::cache {
namespace {

constexpr int kThreads = 256;
/// Tokens per block of reshape_and_cache: one warp's width, so that a warp of the paged value
/// loop covers 32 consecutive tokens.
constexpr int kTileTokens = 32;
constexpr int64_t kMaxGridY = 65535;

/// N elements moved together; on the vector path with 16-byte accesses.
template <typename T, int N>
struct alignas(16) Chunk {
  T v[N];
};

/// One 16-byte store. Spelled as an intrinsic on CUDA: a plain uint4 assignment of loaded data
/// came out as four 4-byte stores.
__device__ __forceinline__ void store16(void* dst, const uint4& v) {
#if defined(USE_ROCM)
  *reinterpret_cast<uint4*>(dst) = v;
#else
  __stwb(reinterpret_cast<uint4*>(dst), v);
#endif
}

template <typename T, int N, bool kVec>
__device__ __forceinline__ void load_chunk(Chunk<T, N>& r, const T* __restrict__ src) {
  if constexpr (kVec && sizeof(T) * N == 4) {  // fine paged values: one 4-byte load
    *reinterpret_cast<uint32_t*>(r.v) = *reinterpret_cast<const uint32_t*>(src);
  } else if constexpr (kVec) {
    static_assert(sizeof(T) * N % 16 == 0, "vector chunks are whole 16-byte vectors");
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(T) * N / 16); ++i) {
      reinterpret_cast<uint4*>(r.v)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = src[i];
  }
}

template <typename T, int N, bool kVec>
__device__ __forceinline__ void store_chunk(T* __restrict__ dst, const Chunk<T, N>& r) {
  if constexpr (kVec) {
    static_assert(sizeof(T) * N % 16 == 0, "vector chunks are whole 16-byte vectors");
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(T) * N / 16); ++i) {
      store16(reinterpret_cast<uint4*>(dst) + i, reinterpret_cast<const uint4*>(r.v)[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = r.v[i];
  }
}

/// A cache element from an input element: the same bits for kAuto caches (In == Out, raw
/// unsigned integers), fp8(x * inv_scale) for fp8 caches.
template <typename Out, typename In>
__device__ __forceinline__ Out to_cache(In x, float inv_scale) {
  if constexpr (std::is_same_v<In, Out>) {
    return x;
  } else {
#if defined(USE_ROCM)
    static_assert(!std::is_same_v<Out, uint8_t>, "fp8 caches need kernels/common/fp8.h (CUDA)");
    return Out{};
#else
    static_assert(std::is_same_v<Out, uint8_t>, "only fp8 caches convert");
    return fp8::quantize(to_float(x), inv_scale);
#endif
  }
}

/// The 16-bit element in the low half of `bits`, as In.
template <typename In>
__device__ __forceinline__ In element(uint32_t bits) {
  static_assert(sizeof(In) == 2, "16-bit elements");
  const uint16_t low = static_cast<uint16_t>(bits);
  In e;
  memcpy(&e, &low, sizeof(e));
  return e;
}

/// The cache rows of a tile's tokens: token t of the tile goes to element
/// block * block_stride + offset * slot_stride of a cache (from its head's base), where
/// slots[t] = block * block_size + offset.
struct TileSlots {
  const int64_t* slots;  ///< the tile's first slot
  int64_t num_slots;
  int64_t block_size;
  int block_shift;  ///< log2(block_size) where it is a power of two, else -1

  /// The row's element offset for a slot read from slots[], or -1 for padding (negative) and
  /// out-of-range slots, which are skipped rather than written out of bounds (the CPU backend
  /// rejects the latter; checking here would cost a synchronisation).
  __device__ __forceinline__ int64_t row(int64_t slot, int64_t block_stride,
                                         int64_t slot_stride) const {
    if (slot < 0 || slot >= num_slots) return -1;
    int64_t block, offset;
    if (block_shift >= 0) {
      block = slot >> block_shift;
      offset = slot & (block_size - 1);
    } else {
      block = slot / block_size;
      offset = slot - block * block_size;
    }
    return block * block_stride + offset * slot_stride;
  }
};

/// The chunk as cache elements: the same bits for kAuto caches, fp8 for fp8 caches.
template <typename Out, typename In, int N>
__device__ __forceinline__ Chunk<Out, N> to_cache_chunk(const Chunk<In, N>& in, float inv_scale) {
  if constexpr (std::is_same_v<In, Out>) {
    return in;
  } else {
    Chunk<Out, N> out;
#pragma unroll
    for (int j = 0; j < N; ++j) out.v[j] = to_cache<Out>(in.v[j], inv_scale);
    return out;
  }
}

/// The items of a (tile tokens x n pieces) grid that this thread takes: i = first, first +
/// step, ..., as (token t, piece c) with i = t * n + c (piece fastest) or, for kTokenFastest,
/// i = c * tile + t. `fastest` divides by the fastest dimension's size (a FastDiv the launch
/// made). Advances without dividing again.
template <bool kTokenFastest>
struct ItemWalk {
  int t, c, step_t, step_c, tile, n;

  __device__ __forceinline__ ItemWalk(int tile_, int n_, const FastDiv& fastest, int first,
                                      int step)
      : tile(tile_), n(n_) {
    const int size = kTokenFastest ? tile : n;
    const int q = static_cast<int>(fastest.div(static_cast<uint32_t>(first)));
    const int step_q = static_cast<int>(fastest.div(static_cast<uint32_t>(step)));
    if constexpr (kTokenFastest) {
      c = q;
      t = first - q * size;
      step_c = step_q;
      step_t = step - step_q * size;
    } else {
      t = q;
      c = first - q * size;
      step_t = step_q;
      step_c = step - step_q * size;
    }
  }

  __device__ __forceinline__ void next() {
    t += step_t;
    c += step_c;
    if constexpr (kTokenFastest) {
      if (t >= tile) {
        t -= tile;
        ++c;
      }
    } else if (c >= n) {
      c -= n;
      ++t;
    }
  }
};

/// Divisors of the kernel's item walks, made at launch: the key and value pieces of a row, and
/// the tokens of a full tile and of the last one.
struct WalkDivs {
  FastDiv key_n;
  FastDiv value_n;
  FastDiv full_tile;
  FastDiv last_tile;
};

/// The pieces the kernels move. Keys (and flash values) in chunks of kCh elements: whole
/// x-chunks in the paged layout (head_size is a multiple of x there), single elements for
/// misaligned flash caches. Paged values are read kVe elements at a time and stored one by one,
/// block_size apart.
template <typename In, typename Out, bool kFlash, bool kVec, bool kFineValues>
struct Pieces {
  static constexpr int kX = 16 / sizeof(Out);  ///< cache elements per 16-byte chunk
  static constexpr int kCh = (kVec || !kFlash) ? kX : 1;
  static constexpr int kVe =
      kFlash ? kCh : (kVec ? static_cast<int>((kFineValues ? 4 : 16) / sizeof(In)) : 1);
};

/// Grid: (ceil(num_tokens / kTileTokens), num_kv_heads, parts); at most kThreads threads. The
/// parts of a tile's blocks take its items in turn, a block's threads at a time. A thread loads
/// its inputs and both slots before anything waits for them (one memory round trip, then the
/// stores).
/// In/Out: raw unsigned integers of the element size for kAuto caches; the input's type and
/// uint8_t for fp8 caches. kVec: 16-byte accesses (pointers, strides and head_size allow them).
/// kFineValues (paged, small problems): paged values are read 4 bytes at a time, so that their
/// one-store-an-element scatter spreads over 4x the threads.
template <typename In, typename Out, bool kFlash, bool kVec, bool kFineValues = false>
__global__ void __launch_bounds__(kThreads)
    reshape_and_cache_kernel(const ReshapeAndCacheProblem p, const int block_shift,
                             const WalkDivs divs) {
  pdl_prologue();
  using P = Pieces<In, Out, kFlash, kVec, kFineValues>;
  constexpr int kX = P::kX, kCh = P::kCh, kVe = P::kVe;

  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTileTokens;
  const int64_t h = blockIdx.y;
  const int tile =
      static_cast<int>(p.num_tokens - t0 < kTileTokens ? p.num_tokens - t0 : kTileTokens);
  const TileSlots slots{p.slot_mapping + t0, p.num_slots, p.block_size, block_shift};
  float inv_k = 1.0f, inv_v = 1.0f;
  if constexpr (!std::is_same_v<In, Out>) {
    inv_k = 1.0f / *p.k_scale;
    inv_v = 1.0f / *p.v_scale;
  }
  const In* key = static_cast<const In*>(p.key) + t0 * p.key_token_stride + h * p.key_head_stride;
  const In* value =
      static_cast<const In*>(p.value) + t0 * p.value_token_stride + h * p.value_head_stride;
  Out* key_cache = static_cast<Out*>(p.key_cache) + h * p.key_cache_head_stride;
  Out* value_cache = static_cast<Out*>(p.value_cache) + h * p.value_cache_head_stride;
  // Within a head, key chunk c of slot offset o sits at o * key_slot_stride + c *
  // key_chunk_stride: paged (c * block_size + o) * x, flash o * slot_stride + c * kCh.
  const int64_t key_slot_stride = kFlash ? p.key_cache_slot_stride : kX;
  const int64_t key_chunk_stride = kFlash ? kCh : p.block_size * kX;
  const int64_t value_slot_stride = kFlash ? p.value_cache_slot_stride : 1;

  // Keys go chunk-fastest; values chunk-fastest (flash) or token-fastest (paged). A thread
  // takes one key and one value item per step and issues all four loads (inputs and slots)
  // before its stores.
  const int key_n = static_cast<int>(p.head_size / kCh);
  const int value_n = static_cast<int>(p.head_size / kVe);
  const int key_total = tile * key_n;
  const int value_total = tile * value_n;
  const int total = key_total > value_total ? key_total : value_total;
  const int first = static_cast<int>(blockIdx.z * blockDim.x + threadIdx.x);
  const int step = static_cast<int>(gridDim.z * blockDim.x);
  const FastDiv& tile_div = tile == kTileTokens ? divs.full_tile : divs.last_tile;
  ItemWalk<false> kw(tile, key_n, divs.key_n, first, step);
  ItemWalk<!kFlash> vw(tile, value_n, kFlash ? divs.value_n : tile_div, first, step);
  for (int i = first; i < total; i += step) {
    const bool has_key = i < key_total;
    const bool has_value = i < value_total;
    Chunk<In, kCh> k_in;
    Chunk<In, kVe> v_in;
    if (has_key) load_chunk<In, kCh, kVec>(k_in, key + kw.t * p.key_token_stride + kw.c * kCh);
    if (has_value) {
      load_chunk<In, kVe, kVec>(v_in, value + vw.t * p.value_token_stride + vw.c * kVe);
    }
    const int64_t k_slot = has_key ? slots.slots[kw.t] : -1;
    const int64_t v_slot = has_value ? slots.slots[vw.t] : -1;
    const int64_t k_row = slots.row(k_slot, p.key_cache_block_stride, key_slot_stride);
    const int64_t v_row = slots.row(v_slot, p.value_cache_block_stride, value_slot_stride);
    if (k_row >= 0) {
      store_chunk<Out, kCh, kVec>(key_cache + k_row + kw.c * key_chunk_stride,
                                  to_cache_chunk<Out>(k_in, inv_k));
    }
    if (v_row >= 0) {
      if constexpr (kFlash) {
        store_chunk<Out, kCh, kVec>(value_cache + v_row + vw.c * kCh,
                                    to_cache_chunk<Out>(v_in, inv_v));
      } else {
        Out* d = value_cache + v_row + static_cast<int64_t>(vw.c) * kVe * p.block_size;
#pragma unroll
        for (int j = 0; j < kVe; ++j) d[j * p.block_size] = to_cache<Out>(v_in.v[j], inv_v);
      }
    }
    kw.next();
    vw.next();
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

/// Whether extent + sum (n - 1) * stride over (n, stride) fits an int (the largest element offset
/// of a tensor walked with those sizes and strides, each >= 0).
bool offsets_fit_int(std::initializer_list<std::pair<int64_t, int64_t>> dims, int64_t extent) {
  int64_t room = INT32_MAX - extent;
  if (room < 0) return false;
  for (const auto& [n, stride] : dims) {
    if (n <= 1) continue;
    if (stride < 0 || stride > room / (n - 1)) return false;
    room -= (n - 1) * stride;
  }
  return true;
}

/// The one-step kernel's parameters: 32-bit, and packed so that everything it reads of them
/// (but the fp8 scales) lies in their first 112 bytes, two aligned 64-byte blocks on sm_90,
/// where kernel parameters start at byte 0x210. ReshapeAndCacheProblem and WalkDivs spread
/// them over four, and ptxas read some under a load's predicate, after the first ones had
/// arrived; this layout took 0.12-0.18 us off the flash kernel and 0.25-0.3 us off the paged
/// call at decode sizes on an H100 (kernels/cache/NOTES.md).
struct OneStepArgs {
  const void* key;
  const void* value;
  const int64_t* slot_mapping;
  void* key_cache;
  void* value_cache;
  int num_tokens, head_size, num_slots, block_size;
  int key_token_stride, key_head_stride, value_token_stride, value_head_stride;
  int key_cache_block_stride, key_cache_head_stride, key_cache_slot_stride;
  int value_cache_block_stride, value_cache_head_stride, value_cache_slot_stride;
  /// Multipliers of three FastDivs (kKeyDiv: key pieces of a row; kValueDiv: the value walk's,
  /// flash value pieces of a row, kValueRows a token group's warps, else the last tile's tokens;
  /// kBlockDiv: block_size), and their shifts a byte each; the fourth byte is kValueRows' log2 G.
  uint32_t muls[3], shifts;
  const float* k_scale;  ///< fp8 caches
  const float* v_scale;

  static constexpr int kKeyDiv = 0, kValueDiv = 1, kBlockDiv = 2;
  __device__ __forceinline__ FastDiv div(int i) const {
    FastDiv d;
    d.mul = muls[i];
    d.shift = (shifts >> (8 * i)) & 0xff;
    return d;
  }
};
static_assert(offsetof(OneStepArgs, k_scale) == 112, "the one-step parameters' first 112 bytes");

/// The cache element offset (from its head's base) of an int64 slot read from slot_mapping, in
/// 32 bits, or -1 for padding (negative) and out-of-range slots, which are skipped. num_slots <
/// 2^31 (one unsigned compare covers both ends), and every offset fits an int.
__device__ __forceinline__ int slot_row32(int64_t slot, int num_slots, const FastDiv& block_size,
                                          int bs, int block_stride, int slot_stride) {
  if (static_cast<uint64_t>(slot) >= static_cast<uint64_t>(num_slots)) return -1;
  const int s = static_cast<int>(slot);
  const int block = static_cast<int>(block_size.div(static_cast<uint32_t>(s)));
  return block * block_stride + (s - block * bs) * slot_stride;
}

/// The decode sizes' kernel: the grid's threads cover every item of a tile (a thread takes at
/// most one key and one value item: no loop) and every element offset fits an int. Grid and
/// pieces as reshape_and_cache_kernel's. A thread issues its loads (inputs and both slots)
/// before anything waits for them: one memory round trip, then the stores.
/// kValueRows (kFineValues, where a row's 4-byte value pieces are a multiple of the warp size):
/// a warp takes 32 / G tokens x G consecutive pieces (2G elements) of each (G = 1 << shifts'
/// fourth byte, lanes of one token adjacent); two shuffles within each token's G lanes hand lane
/// p elements p and G + p of them. Each of the warp's two value stores then writes G consecutive
/// elements (block_size apart) of each of its tokens. With G = 4 (8 tokens a warp, the tiles of
/// 8 or more tokens), block_size 16 and a 16-bit cache: one 128-byte line a token where the
/// tokens' slots are scattered (decode), one line for 8 consecutive slots of one block
/// (prefill). Token-fastest, a warp's store reaches one or two elements in each of 16-32 lines
/// where the slots are scattered.
template <typename In, typename Out, bool kFlash, bool kVec, bool kFineValues, bool kValueRows>
__global__ void __launch_bounds__(kThreads) reshape_and_cache_one_step_kernel(const OneStepArgs a) {
  pdl_prologue();
  static_assert(!kValueRows || (kFineValues && sizeof(In) == 2),
                "value rows move 16-bit values in 4-byte pieces");
  using P = Pieces<In, Out, kFlash, kVec, kFineValues>;
  constexpr int kX = P::kX, kCh = P::kCh, kVe = P::kVe;
  const int t0 = static_cast<int>(blockIdx.x) * kTileTokens;
  const int h = static_cast<int>(blockIdx.y);
  const int left = a.num_tokens - t0;
  const int tile = left < kTileTokens ? left : kTileTokens;
  const int key_n = a.head_size / kCh;
  const int value_n = a.head_size / kVe;
  const int i = static_cast<int>(blockIdx.z * blockDim.x + threadIdx.x);
  // Keys chunk-fastest; values chunk-fastest (flash), in token groups (kValueRows) or
  // token-fastest (paged: a warp's stores of one element index land on consecutive tokens'
  // slots).
  const int kt = static_cast<int>(a.div(OneStepArgs::kKeyDiv).div(static_cast<uint32_t>(i)));
  const int kc = i - kt * key_n;
  // kValueRows: log2(G), G lanes a token (the shifts' fourth byte).
  const int log_g = kValueRows ? static_cast<int>(a.shifts >> 24) : 0;
  int vt, vc;
  if constexpr (kValueRows) {
    // Warp w: token group w / d_blocks, piece group w % d_blocks (kValueDiv: d_blocks).
    const int w = i >> 5, lane = i & 31;
    const int tg = static_cast<int>(a.div(OneStepArgs::kValueDiv).div(static_cast<uint32_t>(w)));
    const int db = w - tg * (value_n >> log_g);
    vt = (tg << (5 - log_g)) + (lane >> log_g);
    vc = (db << log_g) + (lane & ((1 << log_g) - 1));
  } else if constexpr (kFlash) {
    vt = static_cast<int>(a.div(OneStepArgs::kValueDiv).div(static_cast<uint32_t>(i)));
    vc = i - vt * value_n;
  } else {
    static_assert(kTileTokens == 32, "a full tile's value walk divides by a shift");
    vc = tile == kTileTokens
             ? i >> 5
             : static_cast<int>(a.div(OneStepArgs::kValueDiv).div(static_cast<uint32_t>(i)));
    vt = i - vc * tile;
  }
  const bool has_key = kt < tile, has_value = (kFlash || kValueRows) ? vt < tile : vc < value_n;
  const int kt_in = has_key ? kt : 0, vt_in = has_value ? vt : 0;
  Chunk<In, kCh> k_in;
  Chunk<In, kVe> v_in;
  if (has_key) {
    load_chunk<In, kCh, kVec>(
        k_in, static_cast<const In*>(a.key) +
                  ((t0 + kt) * a.key_token_stride + h * a.key_head_stride + kc * kCh));
  }
  if (has_value) {
    load_chunk<In, kVe, kVec>(
        v_in, static_cast<const In*>(a.value) +
                  ((t0 + vt) * a.value_token_stride + h * a.value_head_stride + vc * kVe));
  }
  const int64_t k_slot_in = a.slot_mapping[t0 + kt_in], v_slot_in = a.slot_mapping[t0 + vt_in];
  float inv_k = 1.0f, inv_v = 1.0f;
  if constexpr (!std::is_same_v<In, Out>) {
    inv_k = 1.0f / *a.k_scale;
    inv_v = 1.0f / *a.v_scale;
  }
  const FastDiv block_div = a.div(OneStepArgs::kBlockDiv);
  const int bs = a.block_size;
  // Within a head, key chunk c of slot offset o sits at o * key_slot_stride + c *
  // key_chunk_stride: paged (c * block_size + o) * x, flash o * slot_stride + c * kCh.
  const int key_slot_stride = kFlash ? a.key_cache_slot_stride : kX;
  const int key_chunk_stride = kFlash ? kCh : bs * kX;
  const int value_slot_stride = kFlash ? a.value_cache_slot_stride : 1;
  const int k_row = slot_row32(has_key ? k_slot_in : -1, a.num_slots, block_div, bs,
                               a.key_cache_block_stride, key_slot_stride);
  const int v_row = slot_row32(has_value ? v_slot_in : -1, a.num_slots, block_div, bs,
                               a.value_cache_block_stride, value_slot_stride);
  if (k_row >= 0) {
    store_chunk<Out, kCh, kVec>(static_cast<Out*>(a.key_cache) +
                                    (h * a.key_cache_head_stride + k_row + kc * key_chunk_stride),
                                to_cache_chunk<Out>(k_in, inv_k));
  }
  if constexpr (kValueRows) {
    // Every lane shuffles (a token's G lanes are all inside the tile or all past it): lane p of
    // a token's G gets elements p and G + p of the token's 2G, held as pairs by lanes p / 2 and
    // G / 2 + p / 2.
    const int g = 1 << log_g;
    const int p = static_cast<int>(threadIdx.x) & (g - 1);
    const uint32_t pair = *reinterpret_cast<const uint32_t*>(v_in.v);
    const uint32_t first = APHRODITE_SHFL(pair, p >> 1, g);
    const uint32_t second = APHRODITE_SHFL(pair, (g >> 1) + (p >> 1), g);
    if (v_row >= 0) {
      const int shift = (p & 1) * 16;
      // The token's 2G elements start at its first lane's piece.
      Out* d = static_cast<Out*>(a.value_cache) +
               (h * a.value_cache_head_stride + v_row + ((vc - p) * 2 + p) * bs);
      d[0] = to_cache<Out>(element<In>(first >> shift), inv_v);
      d[g * bs] = to_cache<Out>(element<In>(second >> shift), inv_v);
    }
  } else if (v_row >= 0) {
    Out* value_cache = static_cast<Out*>(a.value_cache) + (h * a.value_cache_head_stride + v_row);
    if constexpr (kFlash) {
      store_chunk<Out, kCh, kVec>(value_cache + vc * kCh, to_cache_chunk<Out>(v_in, inv_v));
    } else {
      Out* d = value_cache + vc * kVe * bs;
#pragma unroll
      for (int j = 0; j < kVe; ++j) d[j * bs] = to_cache<Out>(v_in.v[j], inv_v);
    }
  }
}

/// Whether every element offset reshape_and_cache forms for p (inputs and caches) and every slot
/// fits an int.
bool reshape_offsets_fit_int(const ReshapeAndCacheProblem& p) {
  if (p.num_tokens > INT32_MAX || p.num_slots > INT32_MAX) return false;
  const int64_t blocks = p.num_slots / p.block_size, heads = p.num_kv_heads, bs = p.block_size;
  const bool flash = p.layout == CacheLayout::kFlash;
  // Within a head: paged [head_size / x, block_size, x] and [head_size, block_size] contiguous;
  // flash [block_size] slots of slot_stride, head_size contiguous.
  auto cache_fits = [&](int64_t block_stride, int64_t head_stride, int64_t slot_stride) {
    if (flash)
      return offsets_fit_int({{blocks, block_stride}, {heads, head_stride}, {bs, slot_stride}},
                             p.head_size);
    return offsets_fit_int({{blocks, block_stride}, {heads, head_stride}}, p.head_size * bs);
  };
  return offsets_fit_int({{p.num_tokens, p.key_token_stride}, {heads, p.key_head_stride}},
                         p.head_size) &&
         offsets_fit_int({{p.num_tokens, p.value_token_stride}, {heads, p.value_head_stride}},
                         p.head_size) &&
         cache_fits(p.key_cache_block_stride, p.key_cache_head_stride, p.key_cache_slot_stride) &&
         cache_fits(p.value_cache_block_stride, p.value_cache_head_stride,
                    p.value_cache_slot_stride);
}

template <typename In, typename Out>
gpuError_t launch_reshape_typed(const ReshapeAndCacheProblem& p, gpuStream_t stream) {
  constexpr int64_t kX = 16 / sizeof(Out);
  constexpr int64_t in_size = sizeof(In), out_size = sizeof(Out);
  const bool flash = p.layout == CacheLayout::kFlash;
  bool vec = aligned16(p.key) && aligned16(p.value) && aligned16(p.key_cache) &&
             aligned16(p.value_cache) && p.head_size % kX == 0;
  for (int64_t s :
       {p.key_token_stride, p.key_head_stride, p.value_token_stride, p.value_head_stride}) {
    vec = vec && (s * in_size) % 16 == 0;
  }
  for (int64_t s : {p.key_cache_block_stride, p.key_cache_head_stride, p.value_cache_block_stride,
                    p.value_cache_head_stride}) {
    vec = vec && (s * out_size) % 16 == 0;
  }
  if (flash) {
    vec = vec && (p.key_cache_slot_stride * out_size) % 16 == 0 &&
          (p.value_cache_slot_stride * out_size) % 16 == 0;
  }
  int block_shift = -1;
  for (int b = 0; b < 62; ++b) {
    if (p.block_size == (int64_t{1} << b)) block_shift = b;
  }
  // Fewer tile blocks than kDecodeBlocks (decode and small prefill): each (tile, kv head) goes to
  // one kDecodeThreads-thread block per kDecodeThreads items instead of one kThreads block, so
  // that the stores (the paged values are one store per element) spread over more SMs. The
  // launch shapes and kernel variants measured against it are in kernels/cache/NOTES.md.
  constexpr int64_t kDecodeThreads = 64, kDecodeBlocks = 256;
  const int64_t tiles = (p.num_tokens + kTileTokens - 1) / kTileTokens;
  const bool small = tiles * p.num_kv_heads < kDecodeBlocks;
  // Small paged problems with 16-bit inputs also read values in 4-byte pieces (kFineValues).
  const bool fine = small && !flash && vec && in_size == 2;
  const int64_t tile = p.num_tokens < kTileTokens ? p.num_tokens : kTileTokens;  // the largest
  // Fine values whose rows are whole warps of 4-byte pieces go by token groups (kValueRows):
  // group_tokens a warp (8, or the tile's count up to a power of two), G = 32 / group_tokens
  // lanes a token; the values' items are then the tile's tokens rounded up to whole groups.
  const bool value_rows = fine && (p.head_size / 2) % 32 == 0;
  int log_tokens = 0;
  while (log_tokens < 3 && (int64_t{1} << log_tokens) < tile) ++log_tokens;
  const int64_t group_tokens = int64_t{1} << log_tokens;
  const int64_t value_tokens =
      value_rows ? (tile + group_tokens - 1) / group_tokens * group_tokens : tile;
  int64_t threads = kThreads, parts = 1;
  if (small) {
    threads = kDecodeThreads;
    const int64_t items = value_tokens * p.head_size / (fine ? 2 : 8);  // pieces of 16-bit rows
    parts = (items + kDecodeThreads - 1) / kDecodeThreads;
    if (parts > kMaxGridY) parts = kMaxGridY;
    if (parts < 1) parts = 1;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(parts));
  const dim3 block(static_cast<unsigned>(threads));
  // The kernel's piece counts (kCh- and kVe-element pieces of a head_size row).
  const int64_t key_piece = (vec || !flash) ? kX : 1;
  const int64_t value_piece = flash ? key_piece : (vec ? (fine ? 4 : 16) / in_size : 1);
  const int64_t last_tile = p.num_tokens - (tiles - 1) * kTileTokens;
  auto div_by = [](int64_t d) { return FastDiv(static_cast<uint32_t>(d > 1 ? d : 1)); };
  const FastDiv key_div = div_by(p.head_size / key_piece);
  // The kernel's flags: flash, vec, fine (16-bit inputs only).
  auto with_flags = [&](auto&& launch) {
    using T = std::true_type;
    using F = std::false_type;
    if (flash) {
      vec ? launch(T{}, T{}, F{}) : launch(T{}, F{}, F{});
    } else if (fine) {
      if constexpr (in_size == 2) launch(F{}, T{}, T{});
    } else {
      vec ? launch(F{}, T{}, F{}) : launch(F{}, F{}, F{});
    }
  };
  // One item a thread (the parts' threads cover a tile's pieces) and 32-bit offsets: the
  // one-step kernel.
  const int64_t tile_items =
      value_tokens * (p.head_size / (key_piece < value_piece ? key_piece : value_piece));
  if (parts * threads >= tile_items && p.block_size <= INT32_MAX && reshape_offsets_fit_int(p)) {
    const int log_g = 5 - log_tokens;  // kValueRows: log2(G), G = 32 / group_tokens lanes a token
    // kValueDiv: flash a row's value pieces, kValueRows the warps of a token group (a row's
    // pieces / G), else the last tile's tokens.
    const FastDiv value_div = div_by(flash        ? p.head_size / value_piece
                                     : value_rows ? p.head_size / value_piece >> log_g
                                                  : last_tile);
    const FastDiv block_div = div_by(p.block_size);
    auto i32 = [](int64_t v) { return static_cast<int>(v); };
    const OneStepArgs a{p.key,
                        p.value,
                        p.slot_mapping,
                        p.key_cache,
                        p.value_cache,
                        i32(p.num_tokens),
                        i32(p.head_size),
                        i32(p.num_slots),
                        i32(p.block_size),
                        i32(p.key_token_stride),
                        i32(p.key_head_stride),
                        i32(p.value_token_stride),
                        i32(p.value_head_stride),
                        i32(p.key_cache_block_stride),
                        i32(p.key_cache_head_stride),
                        i32(p.key_cache_slot_stride),
                        i32(p.value_cache_block_stride),
                        i32(p.value_cache_head_stride),
                        i32(p.value_cache_slot_stride),
                        {key_div.mul, value_div.mul, block_div.mul},
                        key_div.shift | value_div.shift << 8 | block_div.shift << 16 |
                            static_cast<uint32_t>(log_g) << 24,
                        p.k_scale,
                        p.v_scale};
    with_flags([&](auto flash_, auto vec_, auto fine_) {
      constexpr bool kFine = decltype(fine_)::value;
      auto launch = [&](auto rows_) {
        launch_kernel<reshape_and_cache_one_step_kernel<In, Out, decltype(flash_)::value,
                                                        decltype(vec_)::value, kFine,
                                                        decltype(rows_)::value>>(grid, block, 0,
                                                                                 stream, a);
      };
      if constexpr (kFine) {
        value_rows ? launch(std::true_type{}) : launch(std::false_type{});
      } else {
        launch(std::false_type{});
      }
    });
  } else {
    const WalkDivs divs{key_div, div_by(p.head_size / value_piece), div_by(kTileTokens),
                        div_by(last_tile)};
    with_flags([&](auto flash_, auto vec_, auto fine_) {
      launch_kernel<reshape_and_cache_kernel<In, Out, decltype(flash_)::value,
                                             decltype(vec_)::value, decltype(fine_)::value>>(
          grid, block, 0, stream, p, block_shift, divs);
    });
  }
  return gpuGetLastError();
}

template <typename V>
__global__ void __launch_bounds__(kThreads) copy_blocks_kernel(const CopyBlocksProblem p) {
  pdl_prologue();
  const int64_t pair = blockIdx.x;
  const bool is_value = blockIdx.z != 0;
  const int64_t src = p.block_mapping[2 * pair];
  const int64_t dst = p.block_mapping[2 * pair + 1];
  char* base = static_cast<char*>(is_value ? p.value_caches[blockIdx.y] : p.key_caches[blockIdx.y]);
  const int64_t stride = is_value ? p.value_block_stride_bytes : p.key_block_stride_bytes;
  const int64_t n =
      (is_value ? p.value_block_bytes : p.key_block_bytes) / static_cast<int64_t>(sizeof(V));
  const V* __restrict__ from = reinterpret_cast<const V*>(base + src * stride);
  V* __restrict__ to = reinterpret_cast<V*>(base + dst * stride);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) to[i] = from[i];
}

template <typename V>
gpuError_t launch_copy_typed(const CopyBlocksProblem& p, gpuStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_pairs), static_cast<unsigned>(p.num_layers), 2);
  launch_kernel<copy_blocks_kernel<V>>(grid, kThreads, 0, stream, p);
  return gpuGetLastError();
}

}  // namespace

gpuError_t launch_reshape_and_cache(const ReshapeAndCacheProblem& p, gpuStream_t stream) {
  if (p.num_tokens == 0 || p.num_kv_heads == 0 || p.head_size == 0) return gpuSuccess;
  if (p.num_kv_heads > kMaxGridY || p.head_size > (int64_t{1} << 20)) return gpuErrorInvalidValue;
  if (p.cache_dtype == KvCacheDtype::kAuto) {
    if (p.dtype == ScalarType::kFloat32) return launch_reshape_typed<uint32_t, uint32_t>(p, stream);
    return launch_reshape_typed<uint16_t, uint16_t>(p, stream);
  }
#if defined(USE_ROCM)
  return gpuErrorInvalidValue;
#else
  switch (p.dtype) {
    case ScalarType::kFloat32: return launch_reshape_typed<float, uint8_t>(p, stream);
    case ScalarType::kFloat16: return launch_reshape_typed<__half, uint8_t>(p, stream);
    case ScalarType::kBFloat16: return launch_reshape_typed<__nv_bfloat16, uint8_t>(p, stream);
  }
  return gpuErrorInvalidValue;
#endif
}

gpuError_t launch_copy_blocks(const CopyBlocksProblem& p, gpuStream_t stream) {
  if (p.num_pairs == 0 || p.num_layers == 0) return gpuSuccess;
  if (p.num_layers > kMaxGridY || p.num_pairs > INT32_MAX) return gpuErrorInvalidValue;
  switch (p.alignment) {
    case 16: return launch_copy_typed<uint4>(p, stream);
    case 8: return launch_copy_typed<uint2>(p, stream);
    case 4: return launch_copy_typed<uint32_t>(p, stream);
    case 2: return launch_copy_typed<uint16_t>(p, stream);
    default: return launch_copy_typed<uint8_t>(p, stream);
  }
}

}  // namespace aphrodite::cache
