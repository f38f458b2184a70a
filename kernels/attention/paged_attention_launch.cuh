// The launchers of the paged_attention kernels: paged_attention_run picks the attention kernel
// for one (query dtype, cache dtype, head size, block size) and launches it; the generated
// per-(dtype, head size) files instantiate it. Torch-free.
#pragma once

#include <type_traits>

#include "attention/paged_attention_kernels.cuh"
#include "attention/paged_attention_mma.cuh"

/// 1: 16-bit queries over same-dtype caches run paged_attention_mma_kernel (generator option
/// paged_attention.kernel=mma, the default; CUDA only); the rest runs staged (which the
/// generator also sets).
#if !defined(APHRODITE_PAGED_ATTENTION_MMA) || !APHRODITE_PAGED_ATTENTION_STAGED
#undef APHRODITE_PAGED_ATTENTION_MMA
#define APHRODITE_PAGED_ATTENTION_MMA 0
#endif
/// 1: the mma kernel's Transformer-XL instantiation is built (generator option
/// paged_attention.xl=on, the default); the dispatch refuses the XL ops where it is not.
#if !defined(APHRODITE_PAGED_ATTENTION_XL)
#define APHRODITE_PAGED_ATTENTION_XL 0
#endif

namespace aphrodite::attention {
namespace detail {

/// A kernel as a type: what paged_attention_run's launcher takes, so that it can hand the kernel
/// to launch_kernel as a template argument.
template <auto Kernel>
struct KernelTag {
  static constexpr auto kKernel = Kernel;
};

#if APHRODITE_PAGED_ATTENTION_MMA

/// The most dynamic shared memory `Kernel` can launch with on the current device: its per-block
/// opt-in limit (227 KiB on sm_90 and sm_100, 163 KiB on sm_80, 99 KiB on sm_86, sm_89 and
/// sm_120, where head sizes 192 and 256 at block size 32, about 103 and 137 KiB, do not fit:
/// those problems run staged) less the kernel's static shared memory; -1 below compute
/// capability 8.0 (mma.sync bf16, ldmatrix, cp.async) or where the runtime cannot say. Looked up
/// once per kernel and device (it was four runtime queries a launch).
template <auto Kernel>
int mma_smem_limit() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  static PerDevice known;  // the limit + 1 (0 is PerDevice's "ask again"), or -1: none
  const int v = known.get(dev, [dev] {
    int major = 0, optin = 0;
    cudaFuncAttributes attr{};
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&attr, Kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return major < 8 ? -1 : optin - static_cast<int>(attr.sharedSizeBytes) + 1;
  });
  return v > 0 ? v - 1 : -1;
}
#endif

}  // namespace detail

/// @brief Launches the attention kernel of one (T, CacheT, head size, block size) for `p`
/// (v1 when `scratch` is nullptr, else v2's split step; the reduce is launched by the caller).
/// Picks kG (query heads per block) from the GQA group size. Returns the launch's error code.
template <typename T, typename CacheT, int kHead, int kBS>
gpuError_t paged_attention_run(const PagedAttentionProblem& p,
                               const PagedAttentionV2Scratch* scratch, gpuStream_t stream) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  detail::Launch l{};
  int64_t partitions = 1;
  if (scratch != nullptr) {
    l.exp_sums = scratch->exp_sums;
    l.max_logits = scratch->max_logits;
    l.tmp_out = scratch->tmp_out;
    l.max_num_partitions = scratch->max_num_partitions;
    l.partition_size = scratch->partition_size;
    // The partitions of the longest sequence: a larger scratch's further ones stay unused (a
    // block there would find no token of any sequence).
    const int64_t used = (p.max_seq_len + l.partition_size - 1) / l.partition_size;
    partitions = used < 1                             ? 1
                 : used < scratch->max_num_partitions ? used
                                                      : scratch->max_num_partitions;
  } else {
    l.partition_size = int64_t{1} << 40;  // one partition, whatever max_seq_len says
  }
  const unsigned grid_z =
      static_cast<unsigned>(p.num_seqs < detail::kMaxGridZ ? p.num_seqs : detail::kMaxGridZ);
  // `kernel`: a KernelTag (launch_kernel takes the kernel as a template argument).
  auto launch = [&](auto kernel, int kG, int smem) {
    constexpr auto kKernel = decltype(kernel)::kKernel;
    l.num_splits = static_cast<int>((group + kG - 1) / kG);
    const dim3 grid(static_cast<unsigned>(p.num_kv_heads * l.num_splits),
                    static_cast<unsigned>(partitions), grid_z);
#if APHRODITE_PAGED_ATTENTION_STAGED
    // Dynamic shared memory past 48 KiB must be allowed per kernel (on the current device): the
    // most it may launch with, since a one-wave grid launched with PDL keeps to a block an SM
    // (launch.cuh says why).
    const int floor = one_block_an_sm_floor<kKernel>();
    const gpuError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              smem > floor ? smem : floor);
    if (e != gpuSuccess) return e;
    smem = one_block_an_sm_smem(grid, smem, floor);
#endif
    return launch_kernel<kKernel>(grid, dim3(detail::kThreads), smem, stream, p, l);
  };
#if APHRODITE_PAGED_ATTENTION_MMA
  // paged_attention.kernel=mma: the tensor-core kernel for 16-bit queries over caches of the
  // same dtype, on sm_80+ and for partitions of whole steps; everything else runs staged.
  if constexpr (std::is_same_v<T, CacheT> && !std::is_same_v<T, float> && kHead % 16 == 0) {
    using M = detail::MmaShape<T, kHead, kBS>;
    // XL problems take the XL instantiation, which has no ALiBi term (the XL ops pass none):
    // XL with ALiBi, and XL where paged_attention.xl=off left the instantiation out, run staged.
    const bool whole_steps = l.partition_size % M::kU == 0;
    if (p.pos_bias_u == nullptr) {
      constexpr auto kKernel = detail::paged_attention_mma_kernel<T, kHead, kBS, false>;
      if (whole_steps && M::kSmemBytes <= detail::mma_smem_limit<kKernel>()) {
        return launch(detail::KernelTag<kKernel>{}, detail::kMmaRows, M::kSmemBytes);
      }
    }
#if APHRODITE_PAGED_ATTENTION_XL
    if (p.pos_bias_u != nullptr && p.alibi_slopes == nullptr) {
      constexpr auto kKernel = detail::paged_attention_mma_kernel<T, kHead, kBS, true>;
      if (whole_steps && M::kSmemBytes <= detail::mma_smem_limit<kKernel>()) {
        return launch(detail::KernelTag<kKernel>{}, detail::kMmaRows, M::kSmemBytes);
      }
    }
#endif
  }
#endif
#if APHRODITE_PAGED_ATTENTION_STAGED
  // paged_attention.kernel=staged: K and V staged through a shared-memory ring (see above).
  const int ring = detail::StagedShape<T, CacheT, kHead, kBS, 1>::kRingBytes;
  if (group <= 1) {
    return launch(
        detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 1>>{}, 1,
        ring);
  }
  if (group <= 4) {
    return launch(
        detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 4>>{}, 4,
        ring);
  }
  return launch(
      detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 8>>{}, 8,
      ring);
#else
  // Group sizes 2 and 3 take the kG = 4 kernel (idle heads cost compute, not bandwidth): one
  // instantiation fewer per file keeps the build's compile time down.
  if (group <= 1)
    return launch(detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 1>>{}, 1,
                  0);
  if (group <= 4)
    return launch(detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 4>>{}, 4,
                  0);
  return launch(detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 8>>{}, 8,
                0);
#endif
}

/// @brief Launches v2's reduce for query element T.
template <typename T>
gpuError_t paged_attention_reduce(const PagedAttentionProblem& p,
                                  const PagedAttentionV2Scratch& scratch, gpuStream_t stream) {
  detail::Launch l{};
  l.exp_sums = scratch.exp_sums;
  l.max_logits = scratch.max_logits;
  l.tmp_out = scratch.tmp_out;
  l.max_num_partitions = scratch.max_num_partitions;
  l.partition_size = scratch.partition_size;
  const unsigned grid_z =
      static_cast<unsigned>(p.num_seqs < detail::kMaxGridZ ? p.num_seqs : detail::kMaxGridZ);
  const dim3 grid(
      static_cast<unsigned>(p.num_heads),
      static_cast<unsigned>((p.head_size + detail::kReduceDims - 1) / detail::kReduceDims), grid_z);
  return launch_kernel<detail::paged_attention_reduce_kernel<T>>(grid, dim3(detail::kReduceThreads),
                                                                 0, stream, p, l);
}

}  // namespace aphrodite::attention
