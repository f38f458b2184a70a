// How the kernels of the activation, cache, fp8_quant, layernorm, rotary, MoE, paged attention
// and marlin families are launched: with programmatic dependent launch (PDL) where their code was
// compiled for sm_90 or newer, plainly elsewhere. (Flash attention launches its own way; marlin
// adds the attribute to each of its launches, cluster, cooperative or plain, with pdl_attribute().)
//
// A kernel launched with PDL may start while the kernel before it in the stream is still
// running: its blocks get scheduled, read their parameters and work out their indices, then wait
// in pdl_prologue() (or pdl_wait()) until that kernel has finished and its writes are visible. At
// decode sizes, where an op is a ~1-2 us kernel and the GPU idles between kernels for the next
// one's launch, that start-up overlaps the previous kernel's tail. A kernel launched with PDL must
// wait before its first access to global memory (its reads may depend on the kernel before it,
// and its writes may land in memory that kernel still reads), and should let the next kernel go
// (pdl_launch_dependents(), which pdl_prologue() calls) early: a next kernel launched with PDL
// otherwise starts only once this grid has exited, later than a plain launch would (~0.2 us on an
// H200). Torch-free.
#pragma once

#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/gpu.h"
#include "common/per_device.h"

namespace aphrodite {

/// Waits until the kernel this one may overlap (PDL) has finished and its writes are visible.
/// Without PDL (older GPUs, ROCm, a plain launch) it returns at once.
__device__ __forceinline__ void pdl_wait() {
#if !defined(USE_ROCM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next kernel in the stream start its own prologue once every block of this grid has
/// called this (or exited). Its blocks then take room on the SMs while they wait: a kernel that
/// keeps the SMs busy for long (paged attention) calls this after its main loop, not before.
__device__ __forceinline__ void pdl_launch_dependents() {
#if !defined(USE_ROCM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// pdl_wait(), then pdl_launch_dependents(): the start of a short kernel. A kernel that
/// launch_kernel() launches begins with this, or with pdl_wait() and triggers later; either way
/// its first access to global memory comes after the wait.
__device__ __forceinline__ void pdl_prologue() {
  pdl_wait();
  pdl_launch_dependents();
}

/// Whether `kernel`'s code on the current device was compiled for sm_90 or newer (its PTX
/// version, which a JIT-compiled image keeps: code from compute_80 PTX has no PDL wait in its
/// prologue whatever GPU runs it); looked up once per kernel and device.
template <auto Kernel>
bool has_pdl_prologue() {
#if defined(USE_ROCM)
  return false;
#else
  static PerDevice known;  // 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // not this launch's error: launch plainly
    return false;
  }
  return known.get(device, [] {
    cudaFuncAttributes attrs = {};
    if (cudaFuncGetAttributes(&attrs, Kernel) != cudaSuccess) {
      (void)cudaGetLastError();  // the launch will report a missing image itself
      return 0;
    }
    return attrs.ptxVersion >= 90 ? 2 : 1;
  }) == 2;
#endif
}

/// Whether APHRODITE_PDL leaves programmatic dependent launch on: unset or "1"; "0" launches
/// plainly (aphrodite_ext refuses to load a module under any other value). Read once.
inline bool pdl_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("APHRODITE_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

/// Whether `Kernel` launches with PDL here: APHRODITE_PDL leaves it on and its code has the
/// prologue (sm_90 and newer).
template <auto Kernel>
bool use_pdl() {
  return pdl_enabled() && has_pdl_prologue<Kernel>();
}

#if !defined(USE_ROCM)
/// SMs of the current device, for grids sized to the machine; 0 where the runtime cannot say.
/// Looked up once per device.
inline int sm_count() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // not this launch's error
    return 0;
  }
  static PerDevice known;
  return known.get(device, [device] {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return count > 0 ? count : 0;
  });
}

/// The dynamic shared memory that keeps `Kernel`'s blocks one an SM where it launches with PDL:
/// just over half an SM's shared memory, less the kernel's static share; 0 where it launches
/// plainly, or may not have that much (its opt-in limit). Looked up once per kernel and device.
template <auto Kernel>
int one_block_an_sm_floor() {
  if (!use_pdl<Kernel>()) return 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  static PerDevice known;  // the floor, or -1: none
  const int floor = known.get(device, [device] {
    int per_sm = 0, optin = 0;
    cudaFuncAttributes attrs{};
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&attrs, Kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    const int dynamic = per_sm / 2 + 1 - static_cast<int>(attrs.sharedSizeBytes);
    return static_cast<int>(attrs.sharedSizeBytes) + dynamic <= optin ? dynamic : -1;
  });
  return floor > 0 ? floor : 0;
}

/// The dynamic shared memory to launch a kernel with, given the `smem` bytes it uses and its
/// one_block_an_sm_floor(): where its grid has at most one block an SM, at least the floor (no
/// SM can then hold two of its blocks); else `smem`. The caller allows the larger of `smem` and
/// the floor (cudaFuncAttributeMaxDynamicSharedMemorySize) where that passes 48 KiB: one value
/// per kernel and device, which host threads launching it with different grids cannot undo for
/// each other.
///
/// Why: blocks of a kernel launched with PDL are placed while the kernel before it still holds
/// SMs; a one-wave grid then ran slower than launched plainly, as if some SMs had taken two of
/// its blocks (sharing the SM, they finish last), and faster once two could not fit. H200, paged
/// attention (128-thread blocks of 80 KiB, two fit an SM) replayed from a CUDA graph, 128-block
/// grids (batch 8, v2; batch 16, v1): 19.94 / 23.54 us with PDL against 18.65 / 21.95 without; at
/// more than half the SM, 17.41 / 21.23. Grids larger than the SMs (136-240 blocks) lost 0.2 us at
/// most with PDL (benchmarks/results/decode_layer_cuda_h200.md).
inline int one_block_an_sm_smem(dim3 grid, int smem, int floor) {
  if (floor <= smem) return smem;
  const int sms = sm_count();
  if (sms <= 0 || int64_t{grid.x} * grid.y * grid.z > sms) return smem;
  return floor;
}

/// The launch attribute that lets a kernel start while the one before it in the stream runs.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  return pdl;
}
#endif

/// Kernel<<<grid, block, smem, stream>>>(args...), with PDL where use_pdl<Kernel>(). Kernel must
/// begin with pdl_prologue(). Returns the launch's error code.
template <auto Kernel, typename... Args>
gpuError_t launch_kernel(dim3 grid, dim3 block, size_t smem, gpuStream_t stream, Args&&... args) {
#if defined(USE_ROCM)
  Kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  return gpuGetLastError();
#else
  cudaLaunchAttribute pdl[1] = {pdl_attribute()};
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = pdl;
  config.numAttrs = use_pdl<Kernel>() ? 1 : 0;
  return cudaLaunchKernelEx(&config, Kernel, std::forward<Args>(args)...);
#endif
}

}  // namespace aphrodite
