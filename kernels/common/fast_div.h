// Integer division helpers for index arithmetic: ceil_div (host and device), and FastDiv, division
// by a run-time constant as a multiply-high, an add and a shift in kernels (a 32-bit integer
// division is ~20 dependent instructions, a 64-bit one a call). Torch-free.
#pragma once

#include <cstdint>

#include "common/gpu.h"

namespace aphrodite {

/// a / b rounded up, for a >= 0 and b > 0 (grid sizes).
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// n / d for 0 <= n < 2^31 and a divisor 1 <= d < 2^31 fixed at launch (the round-up method of
/// Granlund and Montgomery): q = (umulhi(n, mul) + n) >> shift, with 2^shift >= d and
/// mul = floor(2^32 (2^shift - d) / d) + 1 (a power of two gets mul 1, whose high product is 0).
/// The host builds it (one 64-bit division) and passes it by value in the kernel's parameters.
struct FastDiv {
  uint32_t mul = 1;
  uint32_t shift = 0;

  FastDiv() = default;
  __host__ __device__ explicit FastDiv(uint32_t d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d) + 1;
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * mul) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

}  // namespace aphrodite
