// CPU kernel entry points. Every source under kernels/cpu/ is compiled once per ISA (scalar,
// AVX2, AVX-512) into the namespace aphrodite::cpu::<isa>; cpu_isa.h picks one at run time.
// Each entry point handles the rows [row_begin, row_end) so that the caller can spread rows
// over torch's thread pool. Torch-free.
#pragma once

#include <cstdint>

#include "activation/activation.h"
#include "attention/paged_attention.h"
#include "cache/cache.h"
#include "fp8_quant/fp8_quant.h"
#include "layernorm/layernorm.h"
#include "marlin/marlin.h"
#include "moe/moe_align.h"
#include "moe/moe_sum.h"
#include "moe/topk_softmax.h"
#include "rotary/rotary.h"

#define APHRODITE_DECLARE_CPU_KERNELS(isa)                                                        \
  namespace aphrodite::cpu::isa {                                                                 \
  void act_and_mul(activation::Kind kind, const activation::Problem& p, int64_t row_begin,        \
                   int64_t row_end);                                                              \
  void rms_norm(const layernorm::RmsNormProblem& p, int64_t row_begin, int64_t row_end);          \
  void fused_add_rms_norm(const layernorm::FusedAddRmsNormProblem& p, int64_t row_begin,          \
                          int64_t row_end);                                                       \
  void topk_softmax(const moe::TopkSoftmaxProblem& p, int64_t row_begin, int64_t row_end);        \
  void moe_align_block_size(const moe::MoeAlignProblem& p);                                       \
  void moe_sum(const moe::MoeSumProblem& p, int64_t row_begin, int64_t row_end);                  \
  void rotary_embedding(const rotary::RotaryProblem& p, int64_t token_begin, int64_t token_end);  \
  void reshape_and_cache(const cache::ReshapeAndCacheProblem& p, int64_t token_begin,             \
                         int64_t token_end);                                                      \
  void copy_blocks(const cache::CopyBlocksProblem& p, int64_t item_begin, int64_t item_end);      \
  float fp8_absmax(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end);         \
  void fp8_quantize(const fp8_quant::QuantProblem& p, float divisor, int64_t row_begin,           \
                    int64_t row_end);                                                             \
  void fp8_per_token_quant(const fp8_quant::QuantProblem& p, int64_t row_begin, int64_t row_end); \
  /* items = (sequence, kv head) pairs, s * num_kv_heads + kv_head; v2 may be nullptr */          \
  void paged_attention(const attention::PagedAttentionProblem& p,                                 \
                       const attention::PagedAttentionV2Scratch* v2, int64_t item_begin,          \
                       int64_t item_end);                                                         \
  void marlin_repack(const marlin::RepackProblem& p, int64_t word_begin, int64_t word_end);       \
  }

APHRODITE_DECLARE_CPU_KERNELS(scalar)
APHRODITE_DECLARE_CPU_KERNELS(avx2)
APHRODITE_DECLARE_CPU_KERNELS(avx512)
