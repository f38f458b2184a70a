"""RMS normalisation, plain and fused with the residual add (kernels/layernorm)."""

from __future__ import annotations

import torch

from .. import load


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, epsilon: float = 1e-6, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + epsilon) * weight, accumulated in fp32."""
    load("_C")
    out = torch.empty_like(x) if out is None else out
    torch.ops._C.rms_norm(out, x, weight, epsilon)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x; x = rms_norm(residual) * weight. Returns (x, residual)."""
    load("_C")
    torch.ops._C.fused_add_rms_norm(x, residual, weight, epsilon)
    return x, residual


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return (xf * inv * weight.float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(new_residual, weight, epsilon), new_residual
