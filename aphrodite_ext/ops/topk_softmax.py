"""MoE routing: softmax over expert logits, then each token's top-k (kernels/moe)."""

from __future__ import annotations

import torch

from .. import load


def topk_softmax(
    gating_output: torch.Tensor, topk: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (topk_weights fp32, topk_ids int32, token_expert_indices int32), each
    [num_tokens, topk]."""
    load("_moe_C")
    tokens = gating_output.shape[0]
    kw = dict(device=gating_output.device)
    weights = torch.empty(tokens, topk, dtype=torch.float32, **kw)
    ids = torch.empty(tokens, topk, dtype=torch.int32, **kw)
    token_expert = torch.empty(tokens, topk, dtype=torch.int32, **kw)
    torch.ops._moe_C.topk_softmax(weights, ids, token_expert, gating_output, renormalize)
    return weights, ids, token_expert


def topk_softmax_ref(
    gating_output: torch.Tensor, topk: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 softmax and top-k, ties to the lower expert id (a stable sort)."""
    probs = torch.softmax(gating_output.float(), dim=-1)
    order = torch.sort(-probs, dim=-1, stable=True).indices[..., :topk]
    weights, ids = probs.gather(-1, order), order
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids.to(torch.int32)
