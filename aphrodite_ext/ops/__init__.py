"""Typed wrappers of the kernels, one module per family, each with its fp32 reference in plain
torch beside it. The wrappers allocate outputs where the raw ops take them, and load the
extension module that holds the op on first use."""

from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .cache import copy_blocks, reshape_and_cache, reshape_and_cache_flash, swap_blocks
from .flash_attn import flash_attn_varlen_func
from .fp8_quant import (
    dynamic_per_token_scaled_fp8_quant,
    dynamic_scaled_fp8_quant,
    static_scaled_fp8_quant,
)
from .layernorm import fused_add_rms_norm, rms_norm
from .marlin import awq_marlin_repack, gptq_marlin_gemm, gptq_marlin_repack
from .moe_align import moe_align_block_size
from .moe_sum import moe_sum
from .paged_attention import PARTITION_SIZE, paged_attention, xl_paged_attention
from .rotary import rotary_embedding
from .topk_softmax import topk_softmax

__all__ = [
    "PARTITION_SIZE",
    "copy_blocks",
    "dynamic_per_token_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "flash_attn_varlen_func",
    "awq_marlin_repack",
    "fused_add_rms_norm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gptq_marlin_gemm",
    "gptq_marlin_repack",
    "moe_align_block_size",
    "moe_sum",
    "paged_attention",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "swap_blocks",
    "topk_softmax",
    "xl_paged_attention",
]
