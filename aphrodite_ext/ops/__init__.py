"""Typed wrappers of the kernels, one module per family, each with its fp32 reference in plain
torch beside it. The wrappers allocate outputs where the raw ops take them, and load the
extension module that holds the op on first use."""

from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .fp8_quant import (
    dynamic_per_token_scaled_fp8_quant,
    dynamic_scaled_fp8_quant,
    static_scaled_fp8_quant,
)
from .layernorm import fused_add_rms_norm, rms_norm
from .topk_softmax import topk_softmax

__all__ = [
    "fused_add_rms_norm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "rms_norm",
    "silu_and_mul",
    "topk_softmax",
    "static_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant",
]
