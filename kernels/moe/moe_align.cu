// GPU kernel of moe_align_block_size (moe_align.h): a stable counting sort of the routing
// entries by expert, in one thread block and one launch.
//
// The input is cut into one contiguous chunk per "chunk warp". Phase A: each chunk warp counts its
// chunk's keys into its own row of a shared-memory histogram hist[warp][expert]. Phase B: the
// block turns the per-expert totals into padded starts (a block-wide prefix sum) and each
// hist[w][e] into the position where chunk w's first entry of expert e goes; it also writes the
// padding sentinels, experts_ids and num_tokens_post_pad. Phase C: each chunk warp walks its
// chunk again in order, 32 entries at a time; an entry's rank among the equal keys of lower lanes
// (a warp match) gives its slot, so every expert's entries land in ascending order: the result is
// deterministic. No global atomics, no workspace, no host sync.
// Torch-free.
#include "moe/moe_align.h"

#include <cstdint>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "common/launch.cuh"

namespace aphrodite::moe {
namespace {

constexpr int kMaxThreads = 1024;
/// The widest warp the host may launch for: block sizes are multiples of it, and there are at
/// least as many warps as histogram rows (AMD's CDNA waves are 64 lanes, RDNA's 32).
#if defined(USE_ROCM)
constexpr int64_t kHostMaxWarpSize = 64;
#else
constexpr int64_t kHostMaxWarpSize = 32;
#endif
/// Dynamic shared memory the kernel may use without an opt-in on any GPU: 48 KiB for static
/// and dynamic together, less the static warp sums.
constexpr int64_t kSmemBudgetInts = (48 * 1024 - 256) / 4;
/// Entries a chunk warp should at least have before another warp gets a chunk.
constexpr int64_t kMinEntriesPerChunk = 128;
/// Steps of 32 entries whose ids are loaded before any is processed (hides load latency).
constexpr int kUnroll = 4;

template <typename IdT>
struct AlignArgs {
  const IdT* ids;
  const int32_t* expert_map;  // nullptr: none
  int32_t* sorted;
  int32_t* experts_ids;
  int32_t* total_out;
  int32_t numel;
  int32_t num_experts;
  int32_t block_size;
  int32_t capacity;
  int32_t num_blocks;
  int32_t chunk_warps;  // rows of the histogram; warps past it have no chunk
  int32_t chunk;        // entries per chunk warp
};

/// The expert key of entry i, or -1 when it is dropped (see moe_align.h). smap: the expert map
/// in shared memory, or nullptr.
template <typename IdT>
__device__ __forceinline__ int32_t key_of(const AlignArgs<IdT>& a, const int32_t* smap, int32_t i) {
  const int64_t id = static_cast<int64_t>(a.ids[i]);
  if (id < 0 || id >= a.num_experts) return -1;
  int32_t key = static_cast<int32_t>(id);
  if (smap != nullptr) {
    key = smap[key];
    if (key < 0 || key >= a.num_experts) return -1;
  }
  return key;
}

/// Lanes of the calling warp holding the same value as this lane (all lanes must call it).
__device__ __forceinline__ uint64_t same_key_lanes(int32_t key) {
#if defined(USE_ROCM)
  uint64_t mask = 0;
  for (int j = 0; j < APHRODITE_WARP_SIZE; ++j) {
    if (__shfl(key, j) == key) mask |= uint64_t{1} << j;
  }
  return mask;
#else
  return __match_any_sync(0xffffffffu, key);
#endif
}

__device__ __forceinline__ void warp_sync() {
#if defined(USE_ROCM)
  __builtin_amdgcn_wave_barrier();
#else
  __syncwarp();
#endif
}

/// Exclusive prefix sum of v over the block, and the block total. Every thread must call it.
/// warp_sums: one int per warp of the block.
__device__ __forceinline__ int32_t block_exclusive_sum(int32_t v, int32_t* warp_sums,
                                                       int32_t* total) {
  const int lane = static_cast<int>(threadIdx.x) % APHRODITE_WARP_SIZE;
  const int warp = static_cast<int>(threadIdx.x) / APHRODITE_WARP_SIZE;
  const int num_warps = static_cast<int>(blockDim.x) / APHRODITE_WARP_SIZE;
  // Butterfly scan: `group` is the sum over the aligned group of `mask` lanes holding this lane,
  // `incl` this lane's inclusive prefix within it; a lane in the upper half of a doubled group
  // adds the lower half's sum.
  int32_t incl = v;
  int32_t group = v;
  for (int mask = 1; mask < APHRODITE_WARP_SIZE; mask *= 2) {
    const int32_t other = APHRODITE_SHFL_XOR(group, mask);
    if ((lane & mask) != 0) incl += other;
    group += other;
  }
  if (lane == 0) warp_sums[warp] = group;
  __syncthreads();
  int32_t before = 0;
  int32_t all = 0;
  for (int w = 0; w < num_warps; ++w) {
    const int32_t s = warp_sums[w];
    if (w < warp) before += s;
    all += s;
  }
  *total = all;
  return before + incl - v;
}

template <typename IdT>
__global__ void __launch_bounds__(kMaxThreads) moe_align_kernel(const AlignArgs<IdT> a) {
  pdl_prologue();
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_sums[kMaxThreads / 32];
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = tid % APHRODITE_WARP_SIZE;
  const int warp = tid / APHRODITE_WARP_SIZE;
  const int32_t E = a.num_experts;
  const int32_t B = a.block_size;

  int32_t* hist = smem;                                                          // [chunk_warps][E]
  int32_t* smap = a.expert_map != nullptr ? smem + a.chunk_warps * E : nullptr;  // [E]
  for (int i = tid; i < a.chunk_warps * E; i += threads) hist[i] = 0;
  if (smap != nullptr) {
    for (int e = tid; e < E; e += threads) smap[e] = a.expert_map[e];
  }
  __syncthreads();

  // Phase A: each chunk warp counts its chunk. A key's lowest lane adds the count of its lanes
  // to the warp's own histogram row, so no two lanes touch one counter at once.
  const bool has_chunk = warp < a.chunk_warps;
  const int64_t chunk_begin = static_cast<int64_t>(warp) * a.chunk;
  const int32_t begin = static_cast<int32_t>(chunk_begin < a.numel ? chunk_begin : a.numel);
  const int32_t end =
      static_cast<int32_t>(chunk_begin + a.chunk < a.numel ? chunk_begin + a.chunk : a.numel);
  int32_t* row = hist + (has_chunk ? warp : 0) * E;
  const uint64_t lower_lanes = (uint64_t{1} << lane) - 1;
  if (has_chunk) {
    // Warp-uniform trip count: every lane reaches every match.
    for (int64_t i0 = begin; i0 < end; i0 += kUnroll * APHRODITE_WARP_SIZE) {
      int32_t keys[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = i0 + j * APHRODITE_WARP_SIZE + lane;
        keys[j] = i < end ? key_of(a, smap, static_cast<int32_t>(i)) : -1;
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const uint64_t same = same_key_lanes(keys[j]);
        if (keys[j] >= 0 && (same & lower_lanes) == 0) row[keys[j]] += __popcll(same);
        warp_sync();
      }
    }
  }
  __syncthreads();

  // Phase B: thread t owns experts [t * per, (t + 1) * per).
  const int32_t per = (E + threads - 1) / threads;
  const int32_t e_begin = tid * per < E ? tid * per : E;
  const int32_t e_end = e_begin + per < E ? e_begin + per : E;
  int32_t padded_sum = 0;
  for (int32_t e = e_begin; e < e_end; ++e) {
    int32_t count = 0;
    for (int w = 0; w < a.chunk_warps; ++w) count += hist[w * E + e];
    padded_sum += (count + B - 1) / B * B;
  }
  int32_t total = 0;
  int32_t start = block_exclusive_sum(padded_sum, warp_sums, &total);
  for (int32_t e = e_begin; e < e_end; ++e) {
    int32_t pos = start;
    for (int w = 0; w < a.chunk_warps; ++w) {
      const int32_t c = hist[w * E + e];
      hist[w * E + e] = pos;
      pos += c;
    }
    const int32_t padded_end = start + (pos - start + B - 1) / B * B;
    for (int32_t s = pos; s < padded_end; ++s) a.sorted[s] = a.numel;
    for (int32_t b = start / B; b < padded_end / B; ++b) a.experts_ids[b] = e;
    start = padded_end;
  }
  for (int64_t s = int64_t{total} + tid; s < a.capacity; s += threads) a.sorted[s] = a.numel;
  for (int64_t b = int64_t{total / B} + tid; b < a.num_blocks; b += threads) {
    a.experts_ids[b] = -1;
  }
  if (tid == 0) *a.total_out = total;
  __syncthreads();

  // Phase C: the same walk in order; rank among the equal keys of lower lanes gives the slot.
  if (has_chunk) {
    for (int64_t i0 = begin; i0 < end; i0 += kUnroll * APHRODITE_WARP_SIZE) {
      int32_t keys[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = i0 + j * APHRODITE_WARP_SIZE + lane;
        keys[j] = i < end ? key_of(a, smap, static_cast<int32_t>(i)) : -1;
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int32_t key = keys[j];
        const uint64_t same = same_key_lanes(key);
        const int rank = __popcll(same & lower_lanes);
        int32_t slot = 0;
        if (key >= 0) {
          slot = row[key];
          a.sorted[slot + rank] = static_cast<int32_t>(i0 + j * APHRODITE_WARP_SIZE + lane);
        }
        warp_sync();  // every lane has read row[key] before its lowest lane advances it
        if (key >= 0 && rank == 0) row[key] = slot + __popcll(same);
        warp_sync();
      }
    }
  }
}

template <typename IdT>
gpuError_t launch_typed(const MoeAlignProblem& p, gpuStream_t stream) {
  const int64_t E = p.num_experts;
  const int64_t map_ints = p.expert_map != nullptr ? E : 0;
  const int64_t max_rows = (kSmemBudgetInts - map_ints) / E;
  if (max_rows < 1) return gpuErrorInvalidValue;

  // Enough threads for one expert each in phase B (at least 256 so that the fills spread), a
  // full block once the input is large enough for 32 chunk warps to matter.
  int64_t threads = ceil_div(E, kHostMaxWarpSize) * kHostMaxWarpSize;
  if (threads < 256) threads = 256;
  if (p.numel > 1024) threads = kMaxThreads;
  if (threads > kMaxThreads) threads = kMaxThreads;
  int64_t rows = ceil_div(p.numel, kMinEntriesPerChunk);
  if (rows > threads / kHostMaxWarpSize) rows = threads / kHostMaxWarpSize;
  if (rows > max_rows) rows = max_rows;
  if (rows < 1) rows = 1;
  const int64_t chunk = ceil_div(p.numel, rows);

  AlignArgs<IdT> a;
  a.ids = static_cast<const IdT*>(p.topk_ids);
  a.expert_map = p.expert_map;
  a.sorted = p.sorted_token_ids;
  a.experts_ids = p.experts_ids;
  a.total_out = p.num_tokens_post_pad;
  a.numel = static_cast<int32_t>(p.numel);
  a.num_experts = static_cast<int32_t>(E);
  a.block_size = static_cast<int32_t>(p.block_size);
  a.capacity = static_cast<int32_t>(p.sorted_capacity);
  a.num_blocks = static_cast<int32_t>(p.num_blocks);
  a.chunk_warps = static_cast<int32_t>(rows);
  a.chunk = static_cast<int32_t>(chunk);
  const size_t smem = static_cast<size_t>(rows * E + map_ints) * sizeof(int32_t);
  launch_kernel<moe_align_kernel<IdT>>(1, static_cast<unsigned>(threads), smem, stream, a);
  return gpuGetLastError();
}

}  // namespace

/// @brief Launches moe_align_block_size on `stream`: one block, one launch, no host sync, no
/// workspace. Returns the launch's error code (invalid value for sizes outside moe_align.h's
/// limits).
gpuError_t launch_moe_align_block_size(const MoeAlignProblem& p, gpuStream_t stream) {
  if (p.num_experts < 1 || p.num_experts > kAlignMaxExperts || p.block_size < 1 || p.numel < 0 ||
      p.sorted_capacity > INT32_MAX || p.num_blocks > INT32_MAX ||
      p.sorted_capacity < align_required_capacity(p.numel, p.num_experts, p.block_size) ||
      p.num_blocks * p.block_size < align_required_capacity(p.numel, p.num_experts, p.block_size)) {
    return gpuErrorInvalidValue;
  }
  return p.ids_int64 ? launch_typed<int64_t>(p, stream) : launch_typed<int32_t>(p, stream);
}

}  // namespace aphrodite::moe
