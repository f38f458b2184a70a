// Repack of GPTQ / AWQ 4-bit checkpoints into the marlin tile layout (see marlin.h). One thread
// per output word: the gather is irregular but tiny next to a GEMM, and runs once per model load.
#include "marlin/marlin.h"

namespace aphrodite::marlin {
namespace {

__global__ void repack_kernel(const RepackProblem p, int64_t num_words) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_words;
       i += stride) {
    p.out[i] = repacked_word(p, i);
  }
}

}  // namespace

gpuError_t launch_repack(const RepackProblem& p, gpuStream_t stream) {
  const int64_t num_words = p.size_k * p.size_n / kPackFactor;
  if (num_words == 0) return gpuSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (num_words + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  repack_kernel<<<grid, kThreads, 0, stream>>>(p, num_words);
  return gpuGetLastError();
}

}  // namespace aphrodite::marlin
