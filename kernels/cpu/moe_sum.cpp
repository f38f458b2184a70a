// CPU moe_sum (moe/moe_sum.h): out[t, :] = sum_k input[t, k, :] in fp32, rounded once. Compiled
// once per ISA (see vec.h); each row is summed a vector at a time, k in ascending order.
#include <cstdint>

#include "cpu/cpu_kernels.h"
#include "cpu/vec.h"

namespace aphrodite::cpu::APHRODITE_CPU_ISA {
namespace {

using vec::vf;

template <ScalarType T>
void sum_rows(const moe::MoeSumProblem& p, int64_t row_begin, int64_t row_end) {
  using S = vec::storage_t<T>;
  constexpr int L = vec::kLanes;
  const int64_t H = p.hidden;
  const int64_t K = p.topk;
  for (int64_t t = row_begin; t < row_end; ++t) {
    const S* in = static_cast<const S*>(p.input) + t * p.in_token_stride;
    S* out = static_cast<S*>(p.out) + t * p.out_token_stride;
    int64_t c = 0;
    // Two vectors at a time: two independent chains of adds over k.
    for (; c + 2 * L <= H; c += 2 * L) {
      vf a0{}, a1{};
      for (int64_t k = 0; k < K; ++k) {
        const S* src = in + k * p.in_k_stride + c;
        a0 += vec::load<T>(src);
        a1 += vec::load<T>(src + L);
      }
      vec::store<T>(out + c, a0);
      vec::store<T>(out + c + L, a1);
    }
    for (; c < H; c += L) {
      const int64_t n = H - c < L ? H - c : L;
      vf a{};
      for (int64_t k = 0; k < K; ++k) {
        const S* src = in + k * p.in_k_stride + c;
        a += n == L ? vec::load<T>(src) : vec::load_partial<T>(src, n);
      }
      if (n == L) {
        vec::store<T>(out + c, a);
      } else {
        vec::store_partial<T>(out + c, a, n);
      }
    }
  }
}

}  // namespace

void moe_sum(const moe::MoeSumProblem& p, int64_t row_begin, int64_t row_end) {
  switch (p.dtype) {
    case ScalarType::kFloat32: sum_rows<ScalarType::kFloat32>(p, row_begin, row_end); break;
    case ScalarType::kFloat16: sum_rows<ScalarType::kFloat16>(p, row_begin, row_end); break;
    case ScalarType::kBFloat16: sum_rows<ScalarType::kBFloat16>(p, row_begin, row_end); break;
  }
}

}  // namespace aphrodite::cpu::APHRODITE_CPU_ISA
