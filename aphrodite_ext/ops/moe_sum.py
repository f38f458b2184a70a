"""MoE output reduction: the sum over each token's top-k expert outputs (kernels/moe/moe_sum*)."""

from __future__ import annotations

import torch

from .. import load


def moe_sum(input: torch.Tensor) -> torch.Tensor:
    """input [num_tokens, topk, hidden] -> [num_tokens, hidden], summed in fp32."""
    load("_moe_C")
    out = torch.empty(input.shape[0], input.shape[2], dtype=input.dtype, device=input.device)
    torch.ops._moe_C.moe_sum(input, out)
    return out


def moe_sum_ref(input: torch.Tensor) -> torch.Tensor:
    """fp32 sum over dim 1, rounded once to input's dtype."""
    return input.float().sum(1).to(input.dtype)
