// CPU kernel entry points. Every source under kernels/cpu/ is compiled once per ISA (scalar,
// AVX2, AVX-512) into the namespace aphrodite::cpu::<isa>; cpu_isa.h picks one at run time.
// Each entry point handles the rows [row_begin, row_end) so that the caller can spread rows
// over torch's thread pool. Torch-free.
#pragma once

#include <cstdint>

#include "activation/activation.h"
#include "layernorm/layernorm.h"
#include "marlin/marlin.h"
#include "moe/topk_softmax.h"

#define APHRODITE_DECLARE_CPU_KERNELS(isa)                                                      \
  namespace aphrodite::cpu::isa {                                                               \
  void act_and_mul(activation::Kind kind, const activation::Problem& p, int64_t row_begin,     \
                   int64_t row_end);                                                            \
  void rms_norm(const layernorm::RmsNormProblem& p, int64_t row_begin, int64_t row_end);       \
  void fused_add_rms_norm(const layernorm::FusedAddRmsNormProblem& p, int64_t row_begin,       \
                          int64_t row_end);                                                     \
  void topk_softmax(const moe::TopkSoftmaxProblem& p, int64_t row_begin, int64_t row_end);     \
  void marlin_repack(const marlin::RepackProblem& p, int64_t word_begin, int64_t word_end);     \
  }

APHRODITE_DECLARE_CPU_KERNELS(scalar)
APHRODITE_DECLARE_CPU_KERNELS(avx2)
APHRODITE_DECLARE_CPU_KERNELS(avx512)
