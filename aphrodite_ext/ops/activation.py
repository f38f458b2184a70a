"""Gated activations: act(x[..., :d]) * x[..., d:] (kernels/activation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import load


def _act_and_mul(name: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    load("_C")
    if out is None:
        out = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    getattr(torch.ops._C, name)(out, x)
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:], d = x.shape[-1] // 2."""
    return _act_and_mul("silu_and_mul", x, out)


def gelu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x[..., :d]) (erf form) * x[..., d:]."""
    return _act_and_mul("gelu_and_mul", x, out)


def gelu_tanh_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x[..., :d]) (tanh approximation) * x[..., d:]."""
    return _act_and_mul("gelu_tanh_and_mul", x, out)


REFERENCES = {
    "silu_and_mul": lambda a: F.silu(a),
    "gelu_and_mul": lambda a: F.gelu(a),
    "gelu_tanh_and_mul": lambda a: F.gelu(a, approximate="tanh"),
}


def act_and_mul_ref(name: str, x: torch.Tensor) -> torch.Tensor:
    """The fp32 reference of op `name`, returned in x's dtype."""
    d = x.shape[-1] // 2
    xf = x.float()
    return (REFERENCES[name](xf[..., :d]) * xf[..., d:]).to(x.dtype)
