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
/// 1: the mma kernel's wide (8-warp) instantiations are built beside the 4-warp ones (generator
/// option paged_attention.wide=on, the default).
#if !defined(APHRODITE_PAGED_ATTENTION_WIDE) || !APHRODITE_PAGED_ATTENTION_MMA
#undef APHRODITE_PAGED_ATTENTION_WIDE
#define APHRODITE_PAGED_ATTENTION_WIDE 0
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

#if APHRODITE_PAGED_ATTENTION_WIDE
/// Warps of a wide block.
inline constexpr int kMmaWideWarps = 8;
/// The largest per-block opt-in shared memory of any GPU (sm_90, sm_100: 227 KiB).
inline constexpr int kMaxSmemOptin = 227 * 1024;

/// Whether the tensor-core kernel runs wide blocks (where their shared memory fits the device:
/// not on sm_86, sm_89, sm_120; on sm_80 not at head 128 below block size 32, among others):
/// where `grid` has at most a block an SM and its partitions of `tokens` tokens give each warp a
/// step of `step` tokens. A block of 4 warps alone on its SM leaves one warp to each scheduler,
/// which then waits on every mma, shuffle and exp2 of its step; 8 warps hide that. bf16, GQA
/// 32/8, head 128, cold L2, v1 over 8 sequences of 1024 / 4096 tokens (64 blocks): an H100 23.7
/// / 73.4 us in 4-warp blocks, 18.3 / 50.7 in wide ones; an H200 23.4 / 73.8 and 17.9 / 49.8.
/// Over 12 sequences (96 blocks) the H200 gained more (23.4 / 73.7 against 19.2 / 56.7), the
/// H100 lost (23.9 / 73.9 against 25.3 / 80.8; not profiled; kernels/attention/NOTES.md).
/// split_kv (aphrodite_ext/ops/paged_attention.py) models this rule.
inline bool mma_wide(dim3 grid, int64_t tokens, int step) {
  const int sms = sm_count();
  return sms > 0 && int64_t{grid.x} * grid.y * grid.z <= sms &&
         tokens >= int64_t{kMmaWideWarps} * step;
}
#endif

/// The warps of the tensor-core kernel's (T, kHead, kBS) blocks, XL (kXL) or plain, that the
/// current device can run: kMmaWideWarps where the wide ones fit too (and were built), kWarps
/// where only the 4-warp ones do, 0 where neither does (the staged kernel runs). The launcher
/// and paged_attention_mma_warps (what split_kv asks) both decide by it.
template <typename T, int kHead, int kBS, bool kXL>
int mma_block_warps() {
  using M = MmaShape<T, kHead, kBS>;
  if (M::smem_bytes(kWarps) >
      mma_smem_limit<paged_attention_mma_kernel<T, kHead, kBS, kXL, kWarps>>()) {
    return 0;
  }
#if APHRODITE_PAGED_ATTENTION_WIDE
  constexpr int kWideSmem = M::smem_bytes(kMmaWideWarps);
  // (not instantiated where no GPU has the shared memory: head 256 at block size 32)
  if constexpr (kWideSmem <= kMaxSmemOptin) {
    if (kWideSmem <=
        mma_smem_limit<paged_attention_mma_kernel<T, kHead, kBS, kXL, kMmaWideWarps>>()) {
      return kMmaWideWarps;
    }
  }
#endif
  return kWarps;
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
  // The grid of blocks of kG query heads each.
  auto grid_for = [&](int kG) {
    l.num_splits = static_cast<int>((group + kG - 1) / kG);
    return dim3(static_cast<unsigned>(p.num_kv_heads * l.num_splits),
                static_cast<unsigned>(partitions), grid_z);
  };
  // `kernel`: a KernelTag (launch_kernel takes the kernel as a template argument).
  auto launch = [&](auto kernel, dim3 grid, int threads, int smem) {
    constexpr auto kKernel = decltype(kernel)::kKernel;
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
    return launch_kernel<kKernel>(grid, dim3(threads), smem, stream, p, l);
  };
#if APHRODITE_PAGED_ATTENTION_MMA
  // paged_attention.kernel=mma: the tensor-core kernel for 16-bit queries over caches of the
  // same dtype, on sm_80+ and for partitions of whole steps; everything else runs staged.
  if constexpr (std::is_same_v<T, CacheT> && !std::is_same_v<T, float> && kHead % 16 == 0) {
    using M = detail::MmaShape<T, kHead, kBS>;
    const dim3 grid = grid_for(detail::kMmaRows);
    const bool whole_steps = l.partition_size % M::kU == 0;
    // Runs the XL (kXL) or the plain instantiation where it can: 4-warp blocks, or wide ones
    // where they fit and detail::mma_wide says so; false where the problem is not for it (err
    // untouched).
    gpuError_t err = gpuSuccess;
    auto run_mma = [&](auto xl) {
      constexpr bool kXL = decltype(xl)::value;
      const int warps = whole_steps ? detail::mma_block_warps<T, kHead, kBS, kXL>() : 0;
      if (warps == 0) return false;
#if APHRODITE_PAGED_ATTENTION_WIDE
      constexpr int kWideSmem = M::smem_bytes(detail::kMmaWideWarps);
      if constexpr (kWideSmem <= detail::kMaxSmemOptin) {
        const int64_t tokens = l.partition_size < p.max_seq_len ? l.partition_size : p.max_seq_len;
        if (warps == detail::kMmaWideWarps && detail::mma_wide(grid, tokens, M::kU)) {
          err = launch(
              detail::KernelTag<
                  detail::paged_attention_mma_kernel<T, kHead, kBS, kXL, detail::kMmaWideWarps>>{},
              grid, detail::kMmaWideWarps * detail::kWarp, kWideSmem);
          return true;
        }
      }
#endif
      err = launch(detail::KernelTag<
                       detail::paged_attention_mma_kernel<T, kHead, kBS, kXL, detail::kWarps>>{},
                   grid, detail::kThreads, M::smem_bytes(detail::kWarps));
      return true;
    };
    // XL problems take the XL instantiation, which has no ALiBi term (the XL ops pass none):
    // XL with ALiBi, and XL where paged_attention.xl=off left the instantiation out, run staged.
    if (p.pos_bias_u == nullptr && run_mma(std::false_type{})) return err;
#if APHRODITE_PAGED_ATTENTION_XL
    if (p.pos_bias_u != nullptr && p.alibi_slopes == nullptr && run_mma(std::true_type{})) {
      return err;
    }
#endif
  }
#endif
#if APHRODITE_PAGED_ATTENTION_STAGED
  // paged_attention.kernel=staged: K and V staged through a shared-memory ring (see above).
  const int ring = detail::StagedShape<T, CacheT, kHead, kBS, 1>::kRingBytes;
  auto launch_staged = [&](auto kernel, int kG) {
    return launch(kernel, grid_for(kG), detail::kThreads, ring);
  };
  if (group <= 1) {
    return launch_staged(
        detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 1>>{}, 1);
  }
  if (group <= 4) {
    return launch_staged(
        detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 4>>{}, 4);
  }
  return launch_staged(
      detail::KernelTag<detail::paged_attention_staged_kernel<T, CacheT, kHead, kBS, 8>>{}, 8);
#else
  // Group sizes 2 and 3 take the kG = 4 kernel (idle heads cost compute, not bandwidth): one
  // instantiation fewer per file keeps the build's compile time down.
  auto launch_plain = [&](auto kernel, int kG) {
    return launch(kernel, grid_for(kG), detail::kThreads, 0);
  };
  if (group <= 1)
    return launch_plain(
        detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 1>>{}, 1);
  if (group <= 4)
    return launch_plain(
        detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 4>>{}, 4);
  return launch_plain(detail::KernelTag<detail::paged_attention_kernel<T, CacheT, kHead, kBS, 8>>{},
                      8);
#endif
}

/// @brief The warps of the tensor-core kernel's blocks that can run problems of this
/// (T, CacheT, head size, block size), XL (`xl`) or not, on the current device: 8 where its
/// wide blocks fit too, 4 where only its 4-warp ones do, 0 where they run in the staged kernel
/// (no tensor-core kernel for these types, or in this build, or room on this device). Which of
/// 8 and 4 a launch takes then depends on its grid (detail::mma_wide).
template <typename T, typename CacheT, int kHead, int kBS>
int paged_attention_mma_warps(bool xl) {
#if APHRODITE_PAGED_ATTENTION_MMA
  if constexpr (std::is_same_v<T, CacheT> && !std::is_same_v<T, float> && kHead % 16 == 0) {
    if (!xl) return detail::mma_block_warps<T, kHead, kBS, false>();
#if APHRODITE_PAGED_ATTENTION_XL
    return detail::mma_block_warps<T, kHead, kBS, true>();
#endif
  }
#endif
  (void)xl;
  return 0;
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
