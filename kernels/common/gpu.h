// The vendor shim: one CUDA source tree serves CUDA and HIP. Kernels include this header instead
// of cuda_runtime.h and use the gpu* names below; HIP's spellings live in rocm/hip_shim.h.
// Torch-free.
#pragma once

#if defined(USE_ROCM)
#include "rocm/hip_shim.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

using gpuStream_t = cudaStream_t;
using gpuError_t = cudaError_t;
constexpr gpuError_t gpuSuccess = cudaSuccess;
constexpr gpuError_t gpuErrorInvalidValue = cudaErrorInvalidValue;
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#define APHRODITE_WARP_SIZE 32
#define APHRODITE_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask))
/// `value` of lane `src` of this lane's `width`-lane segment (every lane of the warp takes part).
#define APHRODITE_SHFL(value, src, width) __shfl_sync(0xffffffffu, (value), (src), (width))
#endif
