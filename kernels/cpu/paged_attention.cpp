// CPU decode attention over the paged KV cache (kernels/attention/paged_attention.h): v1, v2
// and the Transformer-XL variant, in fp32. Compiled once per ISA (see vec.h).
//
// One work item is one (sequence, kv head): the G = num_heads / num_kv_heads query heads that
// share the kv head are computed together, so every K and V element is read from memory once.
// Each item runs two passes per partition of the context (v1: one partition, the whole
// sequence; v2: PagedAttentionV2Scratch::partition_size tokens each):
//   1. K pass: the scores of all its tokens into a logits buffer, then max, exp and sum;
//   2. V pass: the probabilities times V.
// Two passes instead of an online softmax: nothing is rescaled, and the order of every sum is
// fixed, so results are deterministic and do not depend on the thread count.
//
// Both passes work on a block's native layout, vectorised along its contiguous elements:
//   K chunk c of a block is [block_size, x] contiguous, so acc[t * x + i] += q[c * x + i] *
//   k[t * x + i] with a q vector that repeats its x values across the lanes; a token's score is
//   the sum of its x accumulators at the end.
//   V row d of a block is [block_size] contiguous, so acc[d][t] += p[t] * v[d][t], folded into
//   W = min(block_size, lanes) accumulators per row that are summed once per partition.
// Caches stored as fp16/bf16/fp8 are converted block by block into an fp32 scratch first (fp8 by
// cpu/fp8.h's exact 256-entry table; k_scale is folded into q and v_scale into the output).
//
// v2 writes each partition's normalised output to tmp_out, its max logit and exp sum to
// max_logits / exp_sums (the CUDA kernel's convention), and reduces them into out in the same
// work item; partitions past a sequence's end are left untouched.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/fp8.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using attention::KvCacheDtype;
using attention::PagedAttentionProblem;
using attention::PagedAttentionV2Scratch;
using vec::vf;
constexpr int L = vec::kLanes;

/// The element type the caches store, per the problem's dtype and cache dtype.
enum class CacheKind { kF32, kF16, kBF16, kFp8 };

/// n (a multiple of L) cache elements at src as fp32 into dst.
template <CacheKind C>
APHRODITE_VEC_INLINE void convert(float* __restrict dst, const void* src, int64_t n) {
  if constexpr (C == CacheKind::kFp8) {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp8::to_float(s[i]);
  } else {
    constexpr ScalarType T = C == CacheKind::kF32   ? ScalarType::kFloat32
                             : C == CacheKind::kF16 ? ScalarType::kFloat16
                                                    : ScalarType::kBFloat16;
    const auto* s = static_cast<const vec::storage_t<T>*>(src);
    for (int64_t i = 0; i < n; i += L) vec::storeu(dst + i, vec::load<T>(s + i));
  }
}

template <CacheKind C>
constexpr int64_t cache_elem_bytes() {
  return C == CacheKind::kF32 ? 4 : C == CacheKind::kFp8 ? 1 : 2;
}

/// V blocks per step of the V pass (fewer when a block holds more than 2 vectors per row).
constexpr int kValueBlocks = 4;

/// Per-thread buffers of one work item, sized once per call.
struct Buffers {
  std::vector<float> qpat;    // [G][head_size / x][P][L]: scale * (q + u), repeated by lanes
  std::vector<float> logits;  // [G][partition tokens]
  std::vector<float> acc_v;   // [G][head_size * W]
  std::vector<float> k_blk;   // [head_size * block_size], one converted K block
  std::vector<float> v_blk;   // [kValueBlocks][head_size * block_size], converted V blocks
  std::vector<float> zeros;   // [head_size * block_size]
  std::vector<float> part;    // [G][head_size], one partition's output
  std::vector<float> tmp;     // [block_size * x]
  std::vector<float> stats;   // [2][G]: the partition's max logit and exp sum per head
};

/// x[0] + ... + x[N - 1], summed pairwise (a short dependency chain).
template <int N>
APHRODITE_VEC_INLINE float tree_sum(const float* x) {
  if constexpr (N == 1) {
    return x[0];
  } else {
    return tree_sum<N / 2>(x) + tree_sum<N / 2>(x + N / 2);
  }
}

/// The scores of one block's tokens for each of the G heads: logits[g * ld + t] for t < n.
/// kb points at the block's K (fp32, [head_size / x][block_size][x]).
template <int X, int TV>
APHRODITE_VEC_INLINE void block_scores(const float* __restrict kb, const float* __restrict qpat,
                                       int64_t G, int64_t chunks, int64_t block_size, int64_t n,
                                       float* __restrict tmp, float* __restrict logits,
                                       int64_t ld) {
  constexpr int P = X > L ? X / L : 1;  // distinct q vectors per chunk
  const int64_t slab = block_size * X;  // elements of one chunk
  const int64_t vecs = slab / L;
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = qpat + g * chunks * P * L;
    for (int64_t v0 = 0; v0 < vecs; v0 += TV) {
      vf acc[TV] = {};
      for (int64_t c = 0; c < chunks; ++c) {
        const float* ks = kb + c * slab + v0 * L;
        const float* qc = qg + c * P * L;
#pragma GCC unroll 8
        for (int v = 0; v < TV; ++v) {
          acc[v] = vec::fmadd(vec::loadu(qc + (v % P) * L), vec::loadu(ks + v * L), acc[v]);
        }
      }
#pragma GCC unroll 8
      for (int v = 0; v < TV; ++v) vec::storeu(tmp + (v0 + v) * L, acc[v]);
    }
    float* lg = logits + g * ld;
    for (int64_t t = 0; t < n; ++t) lg[t] = tree_sum<X>(tmp + t * X);
  }
}

template <ScalarType T, CacheKind C>
class Item {
 public:
  using S = vec::storage_t<T>;
  static constexpr int X = static_cast<int>(16 / cache_elem_bytes<C>());
  static constexpr int P = X > L ? X / L : 1;

  Item(const PagedAttentionProblem& p, const PagedAttentionV2Scratch* v2, Buffers& buf)
      : p_(p), v2_(v2), b_(buf) {
    G_ = p.num_heads / p.num_kv_heads;
    hd_ = p.head_size;
    bs_ = p.block_size;
    W_ = std::min<int64_t>(bs_, L);
    part_len_ = v2 ? v2->partition_size : std::max<int64_t>(p.max_seq_len, 1);
    b_.qpat.resize(static_cast<size_t>(G_ * hd_ * P * L / X));
    b_.logits.resize(static_cast<size_t>(G_ * part_len_));
    b_.acc_v.resize(static_cast<size_t>(G_ * hd_ * W_));
    b_.k_blk.resize(static_cast<size_t>(hd_ * bs_));
    b_.v_blk.resize(static_cast<size_t>(kValueBlocks * hd_ * bs_));
    b_.zeros.assign(static_cast<size_t>(hd_ * bs_), 0.0f);
    b_.part.resize(static_cast<size_t>(G_ * hd_));
    b_.tmp.resize(static_cast<size_t>(bs_ * X));
    b_.stats.resize(static_cast<size_t>(2 * G_));
    max_ = b_.stats.data();
    sum_ = b_.stats.data() + G_;
    k_scale_ = C == CacheKind::kFp8 ? *p.k_scale : 1.0f;
    v_scale_ = C == CacheKind::kFp8 ? *p.v_scale : 1.0f;
  }

  void run(int64_t s, int64_t kvh) {
    const int64_t len = p_.seq_lens[s];
    const int64_t h0 = kvh * G_;
    if (len <= 0) {
      for (int64_t g = 0; g < G_; ++g) {
        S* o = out_row(s, h0 + g);
        for (int64_t d = 0; d < hd_; d += L) vec::store<T>(o + d, vf{});
      }
      return;
    }
    load_query(s, h0);
    const int64_t parts = (len + part_len_ - 1) / part_len_;
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t t0 = part * part_len_;
      const int64_t t1 = std::min(len, t0 + part_len_);
      scores(s, kvh, h0, len, t0, t1);
      softmax(t1 - t0);
      values(s, kvh, t0, t1);
      finish_partition(s, h0, part, parts);
    }
    if (v2_ != nullptr && parts > 1) reduce(s, h0, parts);
  }

 private:
  S* out_row(int64_t s, int64_t h) {
    return static_cast<S*>(p_.out) + (s * p_.num_heads + h) * hd_;
  }

  /// qpat[g][c][j][l] = scale * k_scale * (q + u)[g][c * X + (j * L + l) % X].
  void load_query(int64_t s, int64_t h0) {
    const float sc = p_.scale * k_scale_;
    const int64_t chunks = hd_ / X;
    float row[256];  // head_size <= 256 (checked by the binding)
    for (int64_t g = 0; g < G_; ++g) {
      const int64_t h = h0 + g;
      const S* q = static_cast<const S*>(p_.query) + s * p_.q_seq_stride + h * p_.q_head_stride;
      const S* u = p_.pos_bias_u == nullptr ? nullptr
                                            : static_cast<const S*>(p_.pos_bias_u) +
                                                  s * p_.u_seq_stride + h * p_.u_head_stride;
      for (int64_t d = 0; d < hd_; d += L) {
        vf v = vec::load<T>(q + d);
        if (u != nullptr) v += vec::load<T>(u + d);
        vec::storeu(row + d, v * sc);
      }
      float* qg = b_.qpat.data() + g * chunks * P * L;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int j = 0; j < P; ++j) {
          for (int l = 0; l < L; ++l) qg[(c * P + j) * L + l] = row[c * X + (j * L + l) % X];
        }
      }
    }
  }

  int64_t block_offset(int64_t s, int64_t kvh, int64_t t) const {
    const int64_t block = p_.block_tables[s * p_.block_table_stride + t / bs_];
    return block * p_.kv_block_stride + kvh * p_.kv_head_stride;
  }

  /// Logits of tokens [t0, t1) into logits[g][t - t0], with ALiBi and matrix_bd added.
  void scores(int64_t s, int64_t kvh, int64_t h0, int64_t len, int64_t t0, int64_t t1) {
    const int64_t chunks = hd_ / X;
    const int64_t vecs = bs_ * X / L;
    for (int64_t t = t0; t < t1; t += bs_) {
      const int64_t n = std::min(bs_, t1 - t);
      const char* src =
          static_cast<const char*>(p_.key_cache) + block_offset(s, kvh, t) * cache_elem_bytes<C>();
      const float* kb;
      if constexpr (C == CacheKind::kF32) {
        kb = reinterpret_cast<const float*>(src);
      } else {
        convert<C>(b_.k_blk.data(), src, hd_ * bs_);
        kb = b_.k_blk.data();
      }
      float* lg = b_.logits.data() + (t - t0);
      if (vecs >= 8) {
        block_scores<X, 8>(kb, b_.qpat.data(), G_, chunks, bs_, n, b_.tmp.data(), lg, part_len_);
      } else if (vecs >= 4) {
        block_scores<X, 4>(kb, b_.qpat.data(), G_, chunks, bs_, n, b_.tmp.data(), lg, part_len_);
      } else {
        block_scores<X, 2>(kb, b_.qpat.data(), G_, chunks, bs_, n, b_.tmp.data(), lg, part_len_);
      }
    }
    const int64_t n = t1 - t0;
    for (int64_t g = 0; g < G_; ++g) {
      float* lg = b_.logits.data() + g * part_len_;
      if (p_.alibi_slopes != nullptr) {
        const float slope = p_.alibi_slopes[h0 + g];
        for (int64_t i = 0; i < n; ++i) lg[i] += slope * static_cast<float>(t0 + i - len + 1);
      }
      if (p_.matrix_bd != nullptr) {  // scaled as the content term (XL)
        const S* bd = static_cast<const S*>(p_.matrix_bd) + s * p_.bd_seq_stride +
                      (h0 + g) * p_.bd_head_stride + t0;
        const vf sc = vec::bcast(p_.scale);
        int64_t i = 0;
        for (; i + L <= n; i += L) {
          vec::storeu(lg + i, vec::fmadd(vec::load<T>(bd + i), sc, vec::loadu(lg + i)));
        }
        if (i < n) {
          const vf r = vec::fmadd(vec::load_partial<T>(bd + i, n - i), sc, vec::loadu(lg + i));
          std::memcpy(lg + i, &r, static_cast<size_t>(n - i) * sizeof(float));
        }
      }
    }
  }

  /// Logits -> probabilities of the partition (normalised by the partition's sum); keeps the
  /// max and sum per head for the v2 scratch.
  void softmax(int64_t n) {
    for (int64_t g = 0; g < G_; ++g) {
      float* lg = b_.logits.data() + g * part_len_;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) m = std::max(m, lg[i]);
      vf sum{};
      int64_t i = 0;
      const vf vm = vec::bcast(m);
      for (; i + L <= n; i += L) {
        const vf e = vec::exp(vec::loadu(lg + i) - vm);
        vec::storeu(lg + i, e);
        sum += e;
      }
      float total = vec::hsum(sum);
      for (; i < n; ++i) {
        const float e = vec::exp(vec::bcast(lg[i] - m))[0];
        lg[i] = e;
        total += e;
      }
      const float inv = 1.0f / total;
      for (int64_t j = 0; j < n; ++j) lg[j] *= inv;
      max_[g] = m;
      sum_[g] = total;
    }
  }

  /// acc_v[g] = sum over tokens [t0, t1) of p * V, folded to W lanes per row.
  void values(int64_t s, int64_t kvh, int64_t t0, int64_t t1) {
    std::fill(b_.acc_v.begin(), b_.acc_v.end(), 0.0f);
    switch (bs_ / W_) {  // V vectors per accumulator vector
      case 1: values_r<1>(s, kvh, t0, t1); break;
      case 2: values_r<2>(s, kvh, t0, t1); break;
      case 4: values_r<4>(s, kvh, t0, t1); break;
      default: values_r<8>(s, kvh, t0, t1); break;
    }
  }

  /// NB blocks at a time, so that each accumulator is loaded and stored once per NB * R
  /// FMAs; the NB * R probability vectors stay in registers.
  template <int R>
  void values_r(int64_t s, int64_t kvh, int64_t t0, int64_t t1) {
    constexpr int NB = kValueBlocks / R > 0 ? kValueBlocks / R : 1;
    static_assert(NB <= kValueBlocks);
    const int64_t acc_vecs = hd_ * W_ / L;
    const int64_t blk = hd_ * bs_;
    for (int64_t t = t0; t < t1; t += NB * bs_) {
      const float* vb[NB];
      int64_t valid[NB];
      for (int b = 0; b < NB; ++b) {
        const int64_t tb = t + b * bs_;
        valid[b] = std::max<int64_t>(0, std::min(bs_, t1 - tb));
        if (valid[b] == 0) {
          vb[b] = b_.zeros.data();  // past the partition: zero probabilities times zeros
          continue;
        }
        const char* src = static_cast<const char*>(p_.value_cache) +
                          block_offset(s, kvh, tb) * cache_elem_bytes<C>();
        if (C == CacheKind::kF32 && valid[b] == bs_) {
          vb[b] = reinterpret_cast<const float*>(src);
          continue;
        }
        float* dst = b_.v_blk.data() + b * blk;
        convert<C>(dst, src, blk);
        // Slots past the sequence may hold anything (NaN included): zero them, as 0 * NaN
        // would poison the sums.
        if (valid[b] < bs_) {
          for (int64_t d = 0; d < hd_; ++d) {
            std::fill(dst + d * bs_ + valid[b], dst + (d + 1) * bs_, 0.0f);
          }
        }
        vb[b] = dst;
      }
      for (int64_t g = 0; g < G_; ++g) {
        // pv[b][j] lane l = p[block b's token (j * L + l) % bs], zero past the valid ones
        // (bs is a power of two).
        vf pv[NB][R];
        const float* lg = b_.logits.data() + g * part_len_ + (t - t0);
        for (int b = 0; b < NB; ++b) {
          for (int j = 0; j < R; ++j) {
            for (int l = 0; l < L; ++l) {
              const int64_t k = (j * L + l) & (bs_ - 1);
              pv[b][j][l] = k < valid[b] ? lg[b * bs_ + k] : 0.0f;
            }
          }
        }
        float* acc = b_.acc_v.data() + g * hd_ * W_;
        for (int64_t a = 0; a < acc_vecs; ++a) {
          vf r = vec::loadu(acc + a * L);
#pragma GCC unroll 8
          for (int b = 0; b < NB; ++b) {
#pragma GCC unroll 8
            for (int j = 0; j < R; ++j) {
              r = vec::fmadd(pv[b][j], vec::loadu(vb[b] + (a * R + j) * L), r);
            }
          }
          vec::storeu(acc + a * L, r);
        }
      }
    }
  }

  /// The partition's output per head: v_scale * sum of each row's W accumulators; v1 stores
  /// it to out, v2 to tmp_out with the partition's max and exp sum.
  void finish_partition(int64_t s, int64_t h0, int64_t part, int64_t parts) {
    for (int64_t g = 0; g < G_; ++g) {
      const float* acc = b_.acc_v.data() + g * hd_ * W_;
      float* o = b_.part.data() + g * hd_;
      for (int64_t d = 0; d < hd_; ++d) {
        float r = 0.0f;
        for (int64_t w = 0; w < W_; ++w) r += acc[d * W_ + w];
        o[d] = r * v_scale_;
      }
      const int64_t h = h0 + g;
      if (v2_ == nullptr || parts == 1) {
        S* out = out_row(s, h);
        for (int64_t d = 0; d < hd_; d += L) vec::store<T>(out + d, vec::loadu(o + d));
      }
      if (v2_ != nullptr) {
        const int64_t idx = (s * p_.num_heads + h) * v2_->max_num_partitions + part;
        v2_->max_logits[idx] = max_[g];
        v2_->exp_sums[idx] = sum_[g];
        std::memcpy(v2_->tmp_out + idx * hd_, o, static_cast<size_t>(hd_) * sizeof(float));
      }
    }
  }

  /// v2: out = sum_p w_p tmp_out_p / sum_p w_p with w_p = exp_sum_p * e^(max_p - max).
  void reduce(int64_t s, int64_t h0, int64_t parts) {
    for (int64_t g = 0; g < G_; ++g) {
      const int64_t base = (s * p_.num_heads + h0 + g) * v2_->max_num_partitions;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t q = 0; q < parts; ++q) m = std::max(m, v2_->max_logits[base + q]);
      float* o = b_.part.data() + g * hd_;
      std::fill(o, o + hd_, 0.0f);
      float total = 0.0f;
      for (int64_t q = 0; q < parts; ++q) {
        const float w = v2_->exp_sums[base + q] * std::exp(v2_->max_logits[base + q] - m);
        total += w;
        const vf vw = vec::bcast(w);
        const float* src = v2_->tmp_out + (base + q) * hd_;
        for (int64_t d = 0; d < hd_; d += L) {
          vec::storeu(o + d, vec::fmadd(vw, vec::loadu(src + d), vec::loadu(o + d)));
        }
      }
      const vf inv = vec::bcast(1.0f / total);
      S* out = out_row(s, h0 + g);
      for (int64_t d = 0; d < hd_; d += L) vec::store<T>(out + d, vec::loadu(o + d) * inv);
    }
  }

  const PagedAttentionProblem& p_;
  const PagedAttentionV2Scratch* v2_;
  Buffers& b_;
  int64_t G_, hd_, bs_, W_, part_len_;
  float k_scale_, v_scale_;
  float* max_;
  float* sum_;
};

template <ScalarType T, CacheKind C>
void run_items(const PagedAttentionProblem& p, const PagedAttentionV2Scratch* v2,
               int64_t item_begin, int64_t item_end) {
  Buffers buf;
  Item<T, C> item(p, v2, buf);
  for (int64_t i = item_begin; i < item_end; ++i) {
    item.run(i / p.num_kv_heads, i % p.num_kv_heads);
  }
}

template <ScalarType T>
void run_dtype(const PagedAttentionProblem& p, const PagedAttentionV2Scratch* v2, int64_t begin,
               int64_t end) {
  constexpr CacheKind native = T == ScalarType::kFloat32   ? CacheKind::kF32
                               : T == ScalarType::kFloat16 ? CacheKind::kF16
                                                           : CacheKind::kBF16;
  if (p.cache_dtype == KvCacheDtype::kFp8E4M3) {
    run_items<T, CacheKind::kFp8>(p, v2, begin, end);
  } else {
    run_items<T, native>(p, v2, begin, end);
  }
}

}  // namespace

void paged_attention(const attention::PagedAttentionProblem& p,
                     const attention::PagedAttentionV2Scratch* v2, int64_t item_begin,
                     int64_t item_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32: run_dtype<ScalarType::kFloat32>(p, v2, item_begin, item_end); break;
    case ScalarType::kFloat16: run_dtype<ScalarType::kFloat16>(p, v2, item_begin, item_end); break;
    case ScalarType::kBFloat16:
      run_dtype<ScalarType::kBFloat16>(p, v2, item_begin, item_end);
      break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
