// CPU repack of GPTQ / AWQ 4-bit checkpoints into the marlin tile layout (marlin/marlin.h), so
// the layout is tested where there is no GPU. Bit-exact with kernels/marlin/marlin_repack.cu:
// both evaluate the same repacked_word().
#include "cpu/cpu_kernels.h"
#include "marlin/marlin.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {

void marlin_repack(const marlin::RepackProblem& p, int64_t word_begin, int64_t word_end) {
  for (int64_t i = word_begin; i < word_end; ++i) p.out[i] = marlin::repacked_word(p, i);
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
