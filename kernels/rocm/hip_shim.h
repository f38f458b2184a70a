// HIP spellings of the names kernels/common/gpu.h gives CUDA code. Torch-free.
#pragma once

#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

using gpuStream_t = hipStream_t;
using gpuError_t = hipError_t;
constexpr gpuError_t gpuSuccess = hipSuccess;
constexpr gpuError_t gpuErrorInvalidValue = hipErrorInvalidValue;
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
// CDNA wavefronts are 64 lanes wide, RDNA's 32; the compiler knows which it targets.
#define APHRODITE_WARP_SIZE warpSize
#define APHRODITE_SHFL_XOR(value, lane_mask) __shfl_xor((value), (lane_mask))
#define APHRODITE_SHFL(value, src, width) __shfl((value), (src), (width))
// CUDA's bfloat16 type name, so kernels name one type on both vendors.
using __nv_bfloat16 = __hip_bfloat16;
