// CPU MoE routing: fp32 softmax over each token's expert logits, then its top-k experts.
// Compiled once per ISA (see vec.h).
#include <cstdint>
#include <limits>

#include "cpu/cpu_kernels.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

constexpr int64_t kChunk = 2048;  // fp32 probabilities held on the stack at a time
static_assert(kChunk % vec::kLanes == 0);
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Selection key: NaN ranks as -inf.
inline float key_of(float v) { return v != v ? kNegInf : v; }

/// The k best (probability, id) pairs seen so far, sorted by descending key with ties in
/// arrival (= ascending id) order, kept in the token's output row.
class TopK {
 public:
  TopK(float* w, int32_t* ids, int64_t k) : w_(w), ids_(ids), k_(k) {}

  /// Offers p[0, n) with ids base, base + 1, ... (ids must arrive in ascending order).
  void scan(const float* p, int64_t n, int64_t base) {
    constexpr int L = vec::kLanes;
    int64_t i = 0;
    for (; i < n && count_ < k_; ++i) fill(p[i], static_cast<int32_t>(base + i));
    if (count_ < k_) return;
    for (; i + L <= n; i += L) {
      if (!vec::any(vec::loadu(p + i) > vec::bcast(worst_))) continue;
      for (int j = 0; j < L; ++j)
        if (p[i + j] > worst_) replace(p[i + j], static_cast<int32_t>(base + i + j));
    }
    for (; i < n; ++i)
      if (p[i] > worst_) replace(p[i], static_cast<int32_t>(base + i));
  }

  int64_t count() const { return count_; }

 private:
  // While the list is not full every candidate goes in.
  void fill(float v, int32_t id) {
    insert(count_++, v, id);
    if (count_ == k_) worst_ = key_of(w_[k_ - 1]);
  }
  // Full list, v beats the last entry (so v is not NaN): it drops the last entry.
  void replace(float v, int32_t id) {
    insert(k_ - 1, v, id);
    worst_ = key_of(w_[k_ - 1]);
  }
  void insert(int64_t pos, float v, int32_t id) {
    const float key = key_of(v);
    while (pos > 0 && key_of(w_[pos - 1]) < key) {
      w_[pos] = w_[pos - 1];
      ids_[pos] = ids_[pos - 1];
      --pos;
    }
    w_[pos] = v;
    ids_[pos] = id;
  }

  float* w_;
  int32_t* ids_;
  int64_t k_;
  int64_t count_ = 0;
  float worst_ = kNegInf;
};

/// Logits [begin, begin + n) of a row as fp32; lanes past the end hold fill.
template <ScalarType T>
APHRODITE_VEC_INLINE vf load_logits(const vec::storage_t<T>* g, int64_t i, int64_t end,
                                    float fill) {
  return i + vec::kLanes <= end ? vec::load<T>(g + i) : vec::load_partial<T>(g + i, end - i, fill);
}

/// e^(x - m) for the lanes at i (zero past end).
template <ScalarType T>
APHRODITE_VEC_INLINE vf exp_shifted(const vec::storage_t<T>* g, int64_t i, int64_t end, vf m) {
  const vf e = vec::exp(load_logits<T>(g, i, end, 0.0f) - m);
  return vec::lane_ids() <
                 vec::bcasti(static_cast<int32_t>(end - i > vec::kLanes ? vec::kLanes : end - i))
             ? e
             : vf{};
}

/// Selects the top k of p[0, n) (k <= n) by k passes of argmax over integer keys: the bits of
/// p (p >= 0, so they order like p), -1 for NaN, INT32_MIN once taken or for padding lanes.
/// keys[0, round_up(n, kLanes)) must be filled. Ties go to the lowest index.
inline void select_by_passes(const float* p, int32_t* keys, int64_t n, int64_t k, float* w,
                             int32_t* ids) {
  constexpr int L = vec::kLanes;
  const int64_t padded = (n + L - 1) / L * L;
  for (int64_t j = 0; j < k; ++j) {
    vec::vi m0 = vec::bcasti(INT32_MIN), m1 = m0;
    int64_t i = 0;
    for (; i + 2 * L <= padded; i += 2 * L) {
      const vec::vi a = vec::loadu(keys + i), b = vec::loadu(keys + i + L);
      m0 = a > m0 ? a : m0;
      m1 = b > m1 ? b : m1;
    }
    if (i < padded) {
      const vec::vi a = vec::loadu(keys + i);
      m0 = a > m0 ? a : m0;
    }
    const vec::vi best = vec::allmax(m0 > m1 ? m0 : m1);
    int64_t idx = 0;
    for (i = 0; i < padded; i += L) {
      const int lane = vec::first_set(vec::loadu(keys + i) == best);
      if (lane >= 0) {
        idx = i + lane;
        break;
      }
    }
    w[j] = p[idx];
    ids[j] = static_cast<int32_t>(idx);
    keys[idx] = INT32_MIN;
  }
}

constexpr int64_t kMaxPassK = 64;  // beyond this the streaming insertion is used

template <ScalarType T>
void topk_softmax_rows(const moe::TopkSoftmaxProblem& p, int64_t row_begin, int64_t row_end) {
  using S = vec::storage_t<T>;
  constexpr int L = vec::kLanes;
  const int64_t E = p.num_experts;
  const int64_t K = p.k;
  const int64_t k_valid = K < E ? K : E;
  const bool fits = E <= kChunk;
  const bool by_passes = fits && K <= kMaxPassK;
  alignas(64) float buf[kChunk];
  alignas(64) int32_t keys[kChunk];
  for (int64_t t = row_begin; t < row_end; ++t) {
    const S* g = static_cast<const S*>(p.gating) + t * p.gating_row_stride;
    float* w = p.topk_weights + t * K;
    int32_t* ids = p.topk_indices + t * K;

    // Row max, NaN ignored (a NaN logit still makes the whole softmax NaN below, like torch).
    vf vm = vec::bcast(kNegInf);
    for (int64_t i = 0; i < E; i += L) {
      const vf v = load_logits<T>(g, i, E, kNegInf);
      vm = v > vm ? v : vm;
    }
    const vf m = vec::allmax(vm);

    // Softmax denominator; the exponentials are kept when the row fits in buf.
    vf s0{}, s1{};
    int64_t i = 0;
    for (; i + L < E; i += 2 * L) {
      const vf e0 = exp_shifted<T>(g, i, E, m);
      const vf e1 = exp_shifted<T>(g, i + L, E, m);
      if (fits) {
        vec::storeu(buf + i, e0);
        vec::storeu(buf + i + L, e1);
      }
      s0 += e0;
      s1 += e1;
    }
    if (i < E) {
      const vf e0 = exp_shifted<T>(g, i, E, m);
      if (fits) vec::storeu(buf + i, e0);
      s0 += e0;
    }
    const vf sum = vec::allsum(s0 + s1);

    int64_t found = k_valid;
    if (by_passes) {
      for (int64_t j = 0; j < E; j += L) {
        const vf pj = vec::loadu(buf + j) / sum;
        vec::storeu(buf + j, pj);
        const vec::vi key = pj == pj ? vec::as_i(pj) : vec::bcasti(-1);
        const vec::vi live = vec::lane_ids() < vec::bcasti(static_cast<int32_t>(E - j));
        vec::storeu(keys + j, live ? key : vec::bcasti(INT32_MIN));
      }
      select_by_passes(buf, keys, E, k_valid, w, ids);
    } else {
      TopK top(w, ids, K);
      for (int64_t c = 0; c < E; c += kChunk) {
        const int64_t n = E - c < kChunk ? E - c : kChunk;
        for (int64_t j = 0; j < n; j += L) {
          const vf e = fits ? vec::loadu(buf + j) : exp_shifted<T>(g, c + j, E, m);
          vec::storeu(buf + j, e / sum);
        }
        top.scan(buf, n, c);
      }
      found = top.count();
    }
    // k > num_experts cannot give distinct ids; the caller should reject it. Pad safely.
    for (int64_t j = found; j < K; ++j) {
      w[j] = 0.0f;
      ids[j] = 0;
    }

    if (p.renormalize) {
      float total = 0.0f;
      for (int64_t j = 0; j < K; ++j) total += w[j];
      for (int64_t j = 0; j < K; ++j) w[j] = w[j] / total;
    }
    int32_t* tei = p.token_expert_indices + t * K;
    for (int64_t j = 0; j < K; ++j) tei[j] = static_cast<int32_t>(j * p.num_tokens + t);
  }
}

}  // namespace

void topk_softmax(const moe::TopkSoftmaxProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.gating_dtype) {
    case ScalarType::kFloat32:
      topk_softmax_rows<ScalarType::kFloat32>(p, row_begin, row_end);
      break;
    case ScalarType::kFloat16:
      topk_softmax_rows<ScalarType::kFloat16>(p, row_begin, row_end);
      break;
    case ScalarType::kBFloat16:
      topk_softmax_rows<ScalarType::kBFloat16>(p, row_begin, row_end);
      break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
