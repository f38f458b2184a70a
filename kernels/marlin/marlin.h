// Marlin-style W4A16 GEMM: our tiled 4-bit weight layout, the repack problems that produce it
// from GPTQ and AWQ checkpoints, and the GEMM problem. Torch-free; the layout helpers are
// shared by the CPU repack, the CUDA repack and the CUDA GEMM.
//
// The packed layout ("marlin tile" layout). The weight w[k, n] (K x N, 4-bit codes 0..15) is cut
// into tiles of 16 (k) x 64 (n). A tile is 128 int32 = 512 bytes, stored as 32 lanes x 4 words:
// lane l (the mma.sync lane that consumes it, g = l / 4, t = l % 4) holds one 16-byte vector
// whose word w serves the two n8 sub-tiles 2w and 2w+1 of the tile. Nibble p of that word
// (bits 4p..4p+3) holds
//     n = 8 * (2w + (p & 1)) + g,        k = 2t + ((p >> 2) & 1) + 8 * ((p >> 1) & 1)
// i.e. the nibble pairs (p, p+4) extracted by ((word >> 4j) & 0x000f000f) for j = 0, 1, 2, 3
// are, in order, the registers b{0,1} of sub-tile 2w, b{0,1} of 2w+1, b{2,3} of 2w and b{2,3}
// of 2w+1 of the m16n8k16 B fragment (PTX ISA: b0,b1 at k = 2t, 2t+1; b2,b3 at k = 2t+8, 2t+9;
// column g), low half first. One 16-byte load per lane per k16 step thus feeds 8 n8 MMAs, and
// dequantization is a mask, an OR with a magic exponent, and one subtract per register pair
// (plus a shift for some pairs: marlin_gemm.cuh).
// Tiles are stored k-tile major: the packed tensor is int32 [K / 16, 2 * N] where row kt holds
// the N / 64 tiles of that k-tile in n order (the same shape as vLLM's Marlin layout, not the
// same content).
#pragma once

#include <cstdint>

#include "common/scalar_type.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define APHRODITE_MARLIN_HD __host__ __device__ __forceinline__
#else
#define APHRODITE_MARLIN_HD inline
#endif

namespace aphrodite::marlin {

constexpr int kTileK = 16;       ///< k extent of one packed tile (one mma k step)
constexpr int kTileN = 64;       ///< n extent of one packed tile (8 n8 sub-tiles)
constexpr int kTileWords = 128;  ///< int32 words per tile: 32 lanes x 4 words
constexpr int kPackFactor = 8;   ///< 4-bit codes per int32

/// AWQ's nibble order: column 8j + c of an AWQ qweight/qzeros word lives in nibble
/// kAwqNibbleOfColumn[c] (AWQ packs columns in the order 0 2 4 6 1 3 5 7).
constexpr int kAwqNibbleOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/// (k, n) of nibble `p` of word `w` of lane `lane` in the tile whose origin is (k0, n0).
APHRODITE_MARLIN_HD void tile_coords(int lane, int w, int p, int64_t k0, int64_t n0, int64_t& k,
                                     int64_t& n) {
  const int g = lane >> 2, t = lane & 3;
  n = n0 + 8 * (2 * w + (p & 1)) + g;
  k = k0 + 2 * t + ((p >> 2) & 1) + 8 * ((p >> 1) & 1);
}

/// Where the source checkpoint comes from.
enum class SourceFormat : int8_t {
  kGptq = 0,  ///< int32 [K / 8, N]: nibble i of word (r, n) is row 8r + i
  kAwq = 1,   ///< int32 [K, N / 8]: column 8j + c of word (k, j) at nibble kAwqNibbleOfColumn[c]
};

/// Repack a 4-bit checkpoint weight into the marlin tile layout. Rows are gathered through
/// `perm` when given (GPTQ act-order): packed row k takes source row perm[k].
struct RepackProblem {
  int32_t* out;         ///< [K / 16, 2 * N], contiguous
  const int32_t* in;    ///< GPTQ [K / 8, N] or AWQ [K, N / 8], contiguous
  const int32_t* perm;  ///< [K] or nullptr
  int64_t size_k;       ///< multiple of 16
  int64_t size_n;       ///< multiple of 64
  SourceFormat format;
};

/// The 4-bit code at (k, n) of the source checkpoint.
APHRODITE_MARLIN_HD uint32_t source_code(const RepackProblem& p, int64_t k, int64_t n) {
  if (p.format == SourceFormat::kGptq) {
    const uint32_t word = static_cast<uint32_t>(p.in[(k >> 3) * p.size_n + n]);
    return (word >> (4 * (k & 7))) & 0xfu;
  }
  constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const uint32_t word = static_cast<uint32_t>(p.in[k * (p.size_n >> 3) + (n >> 3)]);
  return (word >> (4 * kNibble[n & 7])) & 0xfu;
}

/// Output word `index` (in [0, K * N / 8)) of the packed layout.
APHRODITE_MARLIN_HD int32_t repacked_word(const RepackProblem& p, int64_t index) {
  const int64_t row_words = 2 * p.size_n;
  const int64_t kt = index / row_words;
  const int64_t in_row = index - kt * row_words;
  const int64_t nt = in_row / kTileWords;
  const int in_tile = static_cast<int>(in_row - nt * kTileWords);
  const int lane = in_tile >> 2, w = in_tile & 3;
  uint32_t word = 0;
  for (int q = 0; q < 8; ++q) {
    int64_t k, n;
    tile_coords(lane, w, q, kt * kTileK, nt * kTileN, k, n);
    const int64_t src_k = p.perm != nullptr ? p.perm[k] : k;
    if (src_k < 0 || src_k >= p.size_k) continue;  // a bad perm reads as 0, never out of bounds
    word |= source_code(p, src_k, n) << (4 * q);
  }
  return static_cast<int32_t>(word);
}

/// Weight types the GEMM takes, as vLLM's ScalarType ids (scalar_type.hpp: exponent 8 bits,
/// mantissa 8, signed 1, bias 32, finite-only 1, nan_repr 8, from bit 0 up).
constexpr int64_t kVllmUint4b8Id = (int64_t{4} << 8) | (int64_t{8} << 17) | (int64_t{1} << 50);
constexpr int64_t kVllmUint4Id = (int64_t{4} << 8) | (int64_t{1} << 50);

enum class WeightType : int8_t {
  kUint4b8 = 0,  ///< GPTQ symmetric: w = (code - 8) * scale
  kUint4 = 1,    ///< AWQ asymmetric: w = (code - zero) * scale, zero a 4-bit code per group
};

/// out[M, N] = a[M, K] @ dequant(b)[K, N] (+ bias[N]), fp32 accumulation.
/// Group g of rows k with k / group_size == g shares scales[g, :] and zeros[g, :]; act-order
/// is handled by the binding (it gathers the columns of a through perm, so that groups are
/// contiguous in the packed order).
struct GemmProblem {
  void* out;             ///< [M, N], row stride ldc (elements), activation dtype
  const void* a;         ///< [M, K], row stride lda (elements, multiple of 8), 16-byte aligned
  const int32_t* b;      ///< packed [K / 16, 2 * N]
  const void* scales;    ///< [K / group_size, N] contiguous, activation dtype
  const int32_t* zeros;  ///< [K / group_size, N / 8] nibble c of word j = column 8j + c
                         ///< (plain order, see awq_zeros_to_marlin), or nullptr
  const void* bias;      ///< [N] activation dtype, or nullptr
  float* partials;       ///< split-K scratch, GemmPlan::partial_floats fp32 (splits > 1 only)
  /// split-K tile counters, zero on entry, zero again on exit. Not to be shared by launches
  /// that may run at the same time (another stream). A counter found not zero on entry fails the
  /// launch with an illegal-address fault (marlin_gemm.cuh fail_launch), which leaves the CUDA
  /// context unusable, as any such fault does; where the last block sums the tile, all values
  /// but the few that read as the launch's own counts (the arrival check in gemm_kernel).
  int32_t* counters;
  int64_t num_counters;  ///< capacity of counters
  int64_t m, n, k;
  int64_t lda, ldc;
  int64_t group_size;  ///< rows per group; k for one group per channel
  ScalarType dtype;    ///< kFloat16 or kBFloat16
  WeightType weight_type;
  int sm_count;       ///< of the device, for the split heuristic
  int arch = 0;       ///< the device's compute capability, 10 * major + minor (wgmma blocks: 90)
  int dram_gbps = 0;  ///< the device's peak DRAM bandwidth, GB/s (0: unknown)
  /// What a block adds to its tile's counter on arrival: set by the launch, not the caller
  /// (marlin_gemm.cuh next_arrival_step: 1 in the count's bits, the launch's tag above them).
  uint32_t arrival_step = 1;
};

/// How a block's main loop multiplies and is fed (marlin_gemm.cuh Config). kMmaSync: mma.sync,
/// every thread copies its chunks of a stage with cp.async (sm_80 and newer). kMmaSyncTma
/// (sm_90a): the same mma.sync loop, fed by a producer warp through TMA and mbarriers. kWgmma
/// (sm_90a): warpgroup MMA, fed by a producer warpgroup.
enum class Engine { kMmaSync, kMmaSyncTma, kWgmma };

/// One entry of the thread-block shape grid (codegen/marlin.py SHAPES).
struct BlockShape {
  int m_tiles;      ///< m16 tiles per block (block rows = 16 * m_tiles)
  int n_warps;      ///< warps side by side along n (block columns = 64 * n_warps)
  int k_warps = 1;  ///< groups of warps that split each k slice of the block's tile
  /// How the block's main loop multiplies and is fed (marlin_gemm.cuh Config): the sm_90a
  /// engines, kMmaSyncTma (mma.sync fed by a TMA producer warp) and kWgmma (warpgroup MMA), run
  /// on sm_90 only.
  Engine engine = Engine::kMmaSync;

  friend constexpr bool operator==(const BlockShape& a, const BlockShape& b) {
    return a.m_tiles == b.m_tiles && a.n_warps == b.n_warps && a.k_warps == b.k_warps &&
           a.engine == b.engine;
  }
};

/// How the blocks that share a split-K tile sum their partial sums (marlin_gemm.cuh
/// launch_gemm_instance), all in slot order, so that every way gives the same result. kAuto:
/// the launch's choice (kCluster where the tile's blocks fit in a cluster and all of the grid's
/// clusters are resident at once, else kSpread where the whole grid is and a block has more
/// than 8 rows, else kLast). The others, for tests and benchmarks, take that way or fail the
/// launch (cudaErrorNotSupported where it does not apply: no split, stream-K, or a cluster on
/// a block shape or GPU without them; the runtime's error where it refuses the launch).
/// - kCluster (sm_90): the tile's blocks run as one cluster and sum through their shared
///   memory, each a share of the tile. (A build without sm_90 code, run on sm_90 through PTX,
///   launches the cluster, but its kernel sums through global memory as kLast.)
/// - kSpread: the grid is launched cooperatively (every block resident at once); every block
///   stores its slot in global memory, waits for the tile's other blocks, and sums a share.
/// - kLast: every block stores its slot; the last to arrive sums the whole tile.
enum class SplitSum { kAuto, kCluster, kSpread, kLast };

/// What the dispatcher chose for a problem, for tests and benchmarks.
struct GemmPlan {
  BlockShape shape;
  int splits;              ///< most blocks that share a tile's k slices (partial slots)
  int64_t partial_floats;  ///< floats of scratch the plan needs (0 without split)
  /// Blocks per row of blocks (the grid's x): column tiles x splits for split-K; for stream-K
  /// about the blocks resident at once over the row blocks, each taking an equal share of the
  /// row's column tiles x k slices (marlin_gemm.cuh).
  int workers = 0;
  SplitSum sum = SplitSum::kAuto;  ///< how a split tile is summed (the dispatch: kAuto)
};

}  // namespace aphrodite::marlin

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::marlin {
/// @brief Launches the repack into `p.out` on `stream`; returns the launch's error code.
gpuError_t launch_repack(const RepackProblem& p, gpuStream_t stream);
/// @brief Whether this build holds an instantiation for (dtype, weight type, grouped).
bool has_gemm(ScalarType dtype, WeightType weight_type, bool grouped);
/// @brief Picks the thread-block shape and the split for `p` (p.partials may be null).
GemmPlan plan_gemm(const GemmProblem& p);
/// @brief For tuning and benchmarks: the plan with thread-block shape `shape` and `splits`
/// k slices (<= 0: the heuristic's split for that shape; clamped to what the problem allows).
/// Its shape is {0, 0} when this build lacks `shape` for p's combination.
GemmPlan plan_gemm_with(const GemmProblem& p, BlockShape shape, int splits);
/// @brief For tuning and benchmarks: stream-K with thread-block shape `shape`, `workers` blocks
/// per row of blocks (<= 0: the blocks resident at once over the row blocks) each walking an
/// equal share of the (column tile, k slice) units. Its shape is {0, 0} when this build lacks
/// `shape` for p's combination.
GemmPlan plan_gemm_stream_k(const GemmProblem& p, BlockShape shape, int workers);
/// @brief Launches the GEMM per `plan` on `stream`; p.partials must hold
/// plan.partial_floats floats. Returns the launch's error code.
gpuError_t launch_gemm(const GemmProblem& p, const GemmPlan& plan, gpuStream_t stream);
}  // namespace aphrodite::marlin
#endif
