// CPU moe_align_block_size (moe/moe_align.h): a stable counting sort of the routing entries by
// expert, single-threaded (it is O(numel + num_experts) and small next to the GEMMs it feeds).
// Plain C++; compiled once per ISA like every file here, the builds behave the same.
#include <cstdint>
#include <vector>

#include "cpu/cpu_kernels.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

template <typename IdT>
void align(const moe::MoeAlignProblem& p) {
  const IdT* ids = static_cast<const IdT*>(p.topk_ids);
  const int64_t E = p.num_experts;
  const int64_t B = p.block_size;
  const auto sentinel = static_cast<int32_t>(p.numel);
  auto key_of = [&](int64_t i) -> int64_t {
    const auto id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= E) return -1;
    if (p.expert_map == nullptr) return id;
    const int64_t key = p.expert_map[id];
    return key < 0 || key >= E ? -1 : key;
  };

  std::vector<int64_t> next(E, 0);  // counts, then each expert's next free slot
  for (int64_t i = 0; i < p.numel; ++i) {
    const int64_t key = key_of(i);
    if (key >= 0) ++next[key];
  }
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = next[e];
    const int64_t padded = (count + B - 1) / B * B;
    next[e] = total;
    for (int64_t s = total + count; s < total + padded; ++s) p.sorted_token_ids[s] = sentinel;
    for (int64_t b = total / B; b < (total + padded) / B; ++b) {
      p.experts_ids[b] = static_cast<int32_t>(e);
    }
    total += padded;
  }
  for (int64_t s = total; s < p.sorted_capacity; ++s) p.sorted_token_ids[s] = sentinel;
  for (int64_t b = total / B; b < p.num_blocks; ++b) p.experts_ids[b] = -1;
  p.num_tokens_post_pad[0] = static_cast<int32_t>(total);
  for (int64_t i = 0; i < p.numel; ++i) {
    const int64_t key = key_of(i);
    if (key >= 0) p.sorted_token_ids[next[key]++] = static_cast<int32_t>(i);
  }
}

}  // namespace

void moe_align_block_size(const moe::MoeAlignProblem& p) {
  if (p.ids_int64) {
    align<int64_t>(p);
  } else {
    align<int32_t>(p);
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
