"""Typed wrappers of the kernels, one module per family, each with its fp32 reference in plain
torch beside it. The wrappers allocate outputs where the raw ops take them, and load the
extension module that holds the op on first use."""

from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .layernorm import fused_add_rms_norm, rms_norm
from .marlin import awq_marlin_repack, gptq_marlin_gemm, gptq_marlin_repack
from .topk_softmax import topk_softmax

__all__ = [
    "awq_marlin_repack",
    "fused_add_rms_norm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gptq_marlin_gemm",
    "gptq_marlin_repack",
    "rms_norm",
    "silu_and_mul",
    "topk_softmax",
]
