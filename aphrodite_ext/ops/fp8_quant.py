"""FP8 E4M3 quantization of activations: static, dynamic per-tensor and dynamic per-token
scales (kernels/fp8_quant). Every op stores e4m3(x / scale), the fp32 division rounded to
nearest even and saturated to +-448."""

from __future__ import annotations

import math

import torch

from .. import load

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
#: The smallest per-token scale (vLLM's): 1 / (448 * 512).
MIN_PER_TOKEN_SCALE = 1.0 / (FP8_MAX * 512.0)


def static_scaled_fp8_quant(
    x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """e4m3(x / scale) with a given one-element float32 scale."""
    load("_C")
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device) if out is None else out
    torch.ops._C.static_scaled_fp8_quant(out, x, scale)
    return out


def dynamic_scaled_fp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3(x / scale), scale) with scale = max|x| / 448, a [1] float32 tensor (0 for an
    all-zero x, whose elements are then divided by 1)."""
    load("_C")
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(1, dtype=torch.float32, device=x.device)
    torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
    return out, scale


def dynamic_per_token_scaled_fp8_quant(
    x: torch.Tensor, scale_ub: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3(x / scale), scale) with one scale per row, [num_tokens, 1] float32:
    max(min(max|x_t|, scale_ub) / 448, 1 / (448 * 512))."""
    load("_C")
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(math.prod(x.shape[:-1]), 1, dtype=torch.float32, device=x.device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, scale_ub)
    return out, scale


def quantize_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(x / scale) in plain torch: fp32 division, clamp to +-448, round to nearest even."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _div_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    # Divides by a tensor on amax's device: CUDA torch turns a division by a Python number into
    # a multiplication by its reciprocal, which can differ from the kernels' division by an ulp.
    return amax / amax.new_tensor(FP8_MAX)


def static_scaled_fp8_quant_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return quantize_ref(x, scale.float().reshape(()))


def dynamic_scaled_fp8_quant_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = _div_fp8_max(x.float().abs().amax()).reshape(1)
    return quantize_ref(x, torch.where(scale > 0, scale, 1.0)), scale


def dynamic_per_token_scaled_fp8_quant_ref(
    x: torch.Tensor, scale_ub: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.float().abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    scale = _div_fp8_max(amax).clamp(min=MIN_PER_TOKEN_SCALE)
    return quantize_ref(x, scale), scale.reshape(-1, 1)
