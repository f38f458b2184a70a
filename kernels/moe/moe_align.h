// MoE token alignment: groups the flattened (token, k) routing entries by expert and pads each
// expert's group to a multiple of the GEMM block size, so that every block of sorted_token_ids
// belongs to one expert. Entry points for every backend. Torch-free.
#pragma once

#include <cstdint>

namespace aphrodite::moe {

/// Largest num_experts the kernels take (the GPU kernel keeps a histogram per expert in shared
/// memory).
constexpr int64_t kAlignMaxExperts = 4096;

/// Entry i of the flattened topk_ids (i = token * topk + k) has the key
///   e = topk_ids[i]                 without an expert map,
///   e = expert_map[topk_ids[i]]     with one (global -> local expert id, -1: not on this rank);
/// entries whose id is outside [0, num_experts), or whose mapped key is, are dropped.
/// Expert e's entries occupy sorted_token_ids[start[e], start[e] + count[e]) in ascending i
/// (stable), followed by the sentinel numel up to start[e] + round_up(count[e], block_size);
/// start[0] = 0 and each expert starts where the previous one's padded group ends.
/// num_tokens_post_pad[0] = total = the sum of the padded groups. experts_ids[b] = the key of
/// the expert owning block b for b < total / block_size, -1 after. Every sorted_token_ids
/// entry at or past total holds numel. Every entry of both arrays is written.
struct MoeAlignProblem {
  int32_t* sorted_token_ids;     ///< [sorted_capacity]
  int32_t* experts_ids;          ///< [num_blocks]
  int32_t* num_tokens_post_pad;  ///< [1]
  const void* topk_ids;          ///< [numel] contiguous, int32 or int64 (ids_int64)
  const int32_t* expert_map;     ///< [num_experts] or nullptr
  int64_t numel;                 ///< num_tokens * topk
  int64_t num_experts;           ///< 1..kAlignMaxExperts
  int64_t block_size;
  /// Capacities; both must hold the worst case: sorted_capacity >= numel + min(numel,
  /// num_experts) * (block_size - 1), num_blocks >= ceil(that / block_size). Both <= INT32_MAX.
  int64_t sorted_capacity;
  int64_t num_blocks;
  bool ids_int64;
};

/// The smallest sorted_token_ids a problem may be given (see MoeAlignProblem).
inline int64_t align_required_capacity(int64_t numel, int64_t num_experts, int64_t block_size) {
  const int64_t groups = numel < num_experts ? numel : num_experts;
  return numel + groups * (block_size - 1);
}

}  // namespace aphrodite::moe

#if defined(APHRODITE_BACKEND_GPU)
#include "common/gpu.h"
namespace aphrodite::moe {
/// @brief Launches moe_align_block_size on `stream` (one kernel launch, no host sync); returns
/// the launch's error code.
gpuError_t launch_moe_align_block_size(const MoeAlignProblem& p, gpuStream_t stream);
}  // namespace aphrodite::moe
#endif
