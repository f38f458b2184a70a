// GPU kernel of rotary_embedding (rotary.h), in place on query and key. Bandwidth-bound: every
// rotated element is read and written once and nothing else of query or key is touched.
//
// A block is (lanes, head slots, tokens). A lane owns kPairs rotation pairs of a head: with the
// 16-byte path that is 16 bytes of the first half and 16 bytes of the second half of the rotated
// part (neox), or 16 interleaved bytes (GPT-J); layouts that rule 16 bytes out take the widest
// of 8 or 4 bytes that fits, else single elements. A thread loads its lane's cos/sin once per
// token and keeps them in registers for every head it rotates (heads slot, slot + slots, ...,
// query heads first, then key heads); it loads kHeadsPerBatch heads before it stores any. There
// is no shared memory and no cross-thread communication, hence no barrier. Torch-free.
#include "rotary/rotary.h"

#include <cstdint>
#include <type_traits>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace aphrodite::rotary {
namespace {

/// Largest block; also the launch bound.
constexpr int kMaxThreads = 256;
/// Heads a thread loads before it rotates and stores any of them (memory-level parallelism).
constexpr int kHeadsPerBatch = 2;
/// When a token needs fewer threads than this, large inputs put several tokens in a block.
constexpr int kMinTokenThreads = 128;
/// Inputs with fewer than this many blocks of one token each keep one token per block.
constexpr int64_t kMinBlocks = 512;
/// blockDim.z limit.
constexpr int kMaxTokensPerBlock = 64;
/// Grid limit; the kernel loops over tokens beyond it.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

constexpr int min_align(int bytes) { return bytes < 16 ? bytes : 16; }

/// N consecutive elements moved with one access when kAlign is their size (or with 16-byte
/// accesses when they are larger), element by element when kAlign is that of one element.
template <typename T, int N, int kAlign>
struct alignas(kAlign) Chunk {
  T v[N];
};

template <typename T, typename C>
struct RotaryArgs {
  T* query;
  T* key;  ///< nullptr when there are no key heads
  const C* cache;
  const void* positions;
  int64_t num_tokens;
  int64_t positions_stride;
  int64_t query_token_stride;
  int64_t query_head_stride;
  int64_t key_token_stride;
  int64_t key_head_stride;
  int64_t cache_stride;
  int64_t max_position;
  int num_heads;  ///< query heads; heads [num_heads, total_heads) are key heads
  int total_heads;
  int lanes;  ///< lanes per head: rot_dim / 2 / kPairs
  int half;   ///< rot_dim / 2
  bool positions_int32;
};

/// Rotates the first rot_dim elements of every head of query and key of the block's tokens.
/// kPairs: rotation pairs per lane. kAligned: the host checked that every chunk access is
/// aligned to its size (capped at 16 bytes).
template <typename T, typename C, bool kNeox, int kPairs, bool kAligned>
__global__ void __launch_bounds__(kMaxThreads) rotary_kernel(const RotaryArgs<T, C> a) {
  pdl_prologue();
  constexpr int kElems = kNeox ? kPairs : 2 * kPairs;  // elements of one chunk of x
  constexpr int kParts = kNeox ? 2 : 1;                // chunks of x per lane and head
  using X = Chunk<T, kElems, kAligned ? min_align(kElems * sizeof(T)) : alignof(T)>;
  using CS = Chunk<C, kPairs, kAligned ? min_align(kPairs * sizeof(C)) : alignof(C)>;

  const int slots = static_cast<int>(blockDim.y);
  const int head_step = slots * kHeadsPerBatch;
  const int64_t token_step = static_cast<int64_t>(gridDim.x) * blockDim.z;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z; t < a.num_tokens;
       t += token_step) {
    const int64_t pos =
        a.positions_int32
            ? static_cast<int64_t>(static_cast<const int32_t*>(a.positions)[t * a.positions_stride])
            : static_cast<const int64_t*>(a.positions)[t * a.positions_stride];
    // Out-of-range positions are the caller's error (checking them would need a device sync):
    // such tokens are left unchanged and the cache is never read outside its rows.
    const bool valid = static_cast<uint64_t>(pos) < static_cast<uint64_t>(a.max_position);
    const C* cos_row = a.cache + (valid ? pos : 0) * a.cache_stride;
    T* const q_token = a.query + t * a.query_token_stride;
    T* const k_token = a.key != nullptr ? a.key + t * a.key_token_stride : nullptr;

    for (int lane = static_cast<int>(threadIdx.x); lane < a.lanes;
         lane += static_cast<int>(blockDim.x)) {
      const int pair = lane * kPairs;
      const int off0 = kNeox ? pair : 2 * pair;  // the lane's (first) chunk within a head
      const int off1 = pair + a.half;            // neox: its partner chunk in the second half
      int h0 = static_cast<int>(threadIdx.y);
      if (h0 >= a.total_heads) break;

      X x[kHeadsPerBatch][kParts];
      T* head[kHeadsPerBatch];
      auto load_batch = [&](int first) {
#pragma unroll
        for (int u = 0; u < kHeadsPerBatch; ++u) {
          const int h = first + u * slots;
          head[u] = nullptr;
          if (h < a.total_heads) {
            head[u] = h < a.num_heads ? q_token + h * a.query_head_stride
                                      : k_token + (h - a.num_heads) * a.key_head_stride;
            x[u][0] = *reinterpret_cast<const X*>(head[u] + off0);
            if constexpr (kNeox) x[u][1] = *reinterpret_cast<const X*>(head[u] + off1);
          }
        }
      };

      // The first heads' loads do not depend on the position; issue them before cos/sin.
      load_batch(h0);
      const CS c = *reinterpret_cast<const CS*>(cos_row + pair);
      const CS s = *reinterpret_cast<const CS*>(cos_row + a.half + pair);
      float cf[kPairs];
      float sf[kPairs];
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        cf[p] = to_float(c.v[p]);
        sf[p] = to_float(s.v[p]);
      }

      while (true) {
#pragma unroll
        for (int u = 0; u < kHeadsPerBatch; ++u) {
          if (!valid || head[u] == nullptr) continue;
          if constexpr (kNeox) {
            X y0;
            X y1;
#pragma unroll
            for (int p = 0; p < kPairs; ++p) {
              const float v0 = to_float(x[u][0].v[p]);
              const float v1 = to_float(x[u][1].v[p]);
              y0.v[p] = from_float<T>(v0 * cf[p] - v1 * sf[p]);
              y1.v[p] = from_float<T>(v1 * cf[p] + v0 * sf[p]);
            }
            *reinterpret_cast<X*>(head[u] + off0) = y0;
            *reinterpret_cast<X*>(head[u] + off1) = y1;
          } else {
            X y;
#pragma unroll
            for (int p = 0; p < kPairs; ++p) {
              const float v0 = to_float(x[u][0].v[2 * p]);
              const float v1 = to_float(x[u][0].v[2 * p + 1]);
              y.v[2 * p] = from_float<T>(v0 * cf[p] - v1 * sf[p]);
              y.v[2 * p + 1] = from_float<T>(v1 * cf[p] + v0 * sf[p]);
            }
            *reinterpret_cast<X*>(head[u] + off0) = y;
          }
        }
        h0 += head_step;
        if (h0 >= a.total_heads) break;
        load_batch(h0);
      }
    }
  }
}

bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

/// Shapes the block for `lanes` lanes per head and launches.
template <typename T, typename C, bool kNeox, int kPairs, bool kAligned>
gpuError_t launch_rotary(RotaryArgs<T, C> a, int64_t lanes, gpuStream_t stream) {
  a.lanes = static_cast<int>(lanes);
  const int64_t tx = lanes < kMaxThreads ? lanes : kMaxThreads;
  const int64_t slots = ceil_div(a.total_heads, kHeadsPerBatch);
  const int64_t max_slots = kMaxThreads / tx;
  const int64_t ty = slots < max_slots ? slots : max_slots;
  int64_t tz = 1;
  if (tx * ty < kMinTokenThreads && a.num_tokens >= 2 * kMinBlocks) {
    tz = kMinTokenThreads / (tx * ty);
    if (tz > kMaxTokensPerBlock) tz = kMaxTokensPerBlock;
    if (tz > a.num_tokens / kMinBlocks) tz = a.num_tokens / kMinBlocks;
  }
  int64_t blocks = ceil_div(a.num_tokens, tz);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty), static_cast<unsigned>(tz));
  launch_kernel<rotary_kernel<T, C, kNeox, kPairs, kAligned>>(grid, block, 0, stream, a);
  return gpuGetLastError();
}

/// Whether every access of kElems consecutive elements of x (and of its lane's cos/sin) can be
/// one aligned access: the rotated width, every stride and every pointer allow it.
template <typename T, typename C, bool kNeox, int kElems>
bool chunks_aligned(const RotaryArgs<T, C>& a) {
  constexpr int64_t kBytes = kElems * static_cast<int64_t>(sizeof(T));
  // Cache chunks: neox reads kElems cos and kElems sin per lane, GPT-J kElems / 2 of each.
  constexpr int64_t kCacheChunk = (kNeox ? kElems : kElems / 2) * static_cast<int64_t>(sizeof(C));
  constexpr int64_t kCacheAlign = kCacheChunk < 16 ? kCacheChunk : 16;
  const int64_t half = a.half;
  bool ok = (kNeox ? half % kElems == 0 : (2 * half) % kElems == 0) &&
            aligned_to(a.query, kBytes) && a.query_token_stride % kElems == 0 &&
            a.query_head_stride % kElems == 0 && aligned_to(a.cache, kCacheAlign) &&
            (a.cache_stride * static_cast<int64_t>(sizeof(C))) % kCacheAlign == 0 &&
            (half * static_cast<int64_t>(sizeof(C))) % kCacheAlign == 0;
  if (a.key != nullptr) {
    ok = ok && aligned_to(a.key, kBytes) && a.key_token_stride % kElems == 0 &&
         a.key_head_stride % kElems == 0;
  }
  return ok;
}

/// Launches with the widest chunk of at most kElems elements (16 bytes first, then halving down
/// to two elements) that the layout allows, else element by element.
template <typename T, typename C, bool kNeox, int kElems>
gpuError_t launch_widest(const RotaryArgs<T, C>& a, gpuStream_t stream) {
  if constexpr (kElems >= 2) {
    constexpr int kPairs = kNeox ? kElems : kElems / 2;
    if (chunks_aligned<T, C, kNeox, kElems>(a)) {
      return launch_rotary<T, C, kNeox, kPairs, true>(a, a.half / kPairs, stream);
    }
    return launch_widest<T, C, kNeox, kElems / 2>(a, stream);
  } else {
    return launch_rotary<T, C, kNeox, 1, false>(a, a.half, stream);
  }
}

template <typename T, typename C>
gpuError_t run_typed(const RotaryProblem& p, gpuStream_t stream) {
  RotaryArgs<T, C> a;
  a.query = static_cast<T*>(p.query);
  a.key = p.num_kv_heads > 0 ? static_cast<T*>(p.key) : nullptr;
  a.cache = static_cast<const C*>(p.cos_sin_cache);
  a.positions = p.positions;
  a.num_tokens = p.num_tokens;
  a.positions_stride = p.positions_stride;
  a.query_token_stride = p.query_token_stride;
  a.query_head_stride = p.query_head_stride;
  a.key_token_stride = p.key_token_stride;
  a.key_head_stride = p.key_head_stride;
  a.cache_stride = p.cache_stride;
  a.max_position = p.max_position;
  a.num_heads = static_cast<int>(p.num_heads);
  a.total_heads = static_cast<int>(p.num_heads + (a.key != nullptr ? p.num_kv_heads : 0));
  a.half = static_cast<int>(p.rot_dim / 2);
  a.positions_int32 = p.positions_int32;
  a.lanes = 0;
  constexpr int kVec = static_cast<int>(16 / sizeof(T));  // elements of a 16-byte access
  if (p.is_neox) return launch_widest<T, C, true, kVec>(a, stream);
  return launch_widest<T, C, false, kVec>(a, stream);
}

template <typename T>
gpuError_t run_cache_typed(const RotaryProblem& p, gpuStream_t stream) {
  if (p.cache_dtype == ScalarType::kFloat32) return run_typed<T, float>(p, stream);
  if constexpr (!std::is_same_v<T, float>) {
    if (p.cache_dtype == p.dtype) return run_typed<T, T>(p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace

/// @brief Launches the in-place rotation of query and key (rotary.h) on `stream` for the element
/// type p.dtype and cache type p.cache_dtype (p.dtype or kFloat32). Returns the launch's error
/// code; gpuErrorInvalidValue for a problem the kernel cannot take (sizes beyond int range, odd
/// rot_dim, unsupported dtypes).
gpuError_t launch_rotary_embedding(const RotaryProblem& p, gpuStream_t stream) {
  const int64_t total_heads = p.num_heads + (p.key != nullptr ? p.num_kv_heads : 0);
  // No cache rows: no position is valid, and invalid tokens are left unchanged.
  if (p.num_tokens <= 0 || total_heads <= 0 || p.max_position <= 0) return gpuSuccess;
  if (p.rot_dim < 2 || p.rot_dim % 2 != 0 || p.rot_dim > p.head_size || total_heads > INT32_MAX ||
      p.rot_dim > INT32_MAX || p.num_heads < 0 || p.num_kv_heads < 0) {
    return gpuErrorInvalidValue;
  }
  switch (p.dtype) {
    case ScalarType::kFloat32: return run_cache_typed<float>(p, stream);
    case ScalarType::kFloat16: return run_cache_typed<__half>(p, stream);
    case ScalarType::kBFloat16: return run_cache_typed<__nv_bfloat16>(p, stream);
  }
  return gpuErrorInvalidValue;
}

}  // namespace aphrodite::rotary
