"""MoE token alignment: routing entries grouped by expert, padded to the GEMM block size
(kernels/moe/moe_align*)."""

from __future__ import annotations

import torch

from .. import load


def moe_align_capacity(numel: int, num_experts: int, block_size: int) -> int:
    """Entries sorted_token_ids needs: numel + min(numel, num_experts) * (block_size - 1)."""
    return numel + min(numel, num_experts) * (block_size - 1)


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    expert_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (sorted_token_ids, experts_ids, num_tokens_post_pad), all int32.

    The flattened entries i = token * topk + k of topk_ids [num_tokens, topk] are grouped by
    expert, in ascending i within an expert, and each group is padded with the sentinel
    numel = topk_ids.numel() up to a multiple of block_size; groups follow each other in
    expert order. experts_ids holds the expert of each block of block_size entries, -1 past
    num_tokens_post_pad[0] (the padded total); sorted_token_ids holds numel past it. Ids outside
    [0, num_experts) are dropped. With expert_map (int32 [num_experts], global -> local expert
    id, -1 for experts on other ranks) entries are grouped by local id and entries of experts
    mapped to -1 are dropped (vLLM's ignore_invalid_experts behaviour)."""
    load("_moe_C")
    capacity = moe_align_capacity(topk_ids.numel(), num_experts, block_size)
    kw = dict(dtype=torch.int32, device=topk_ids.device)
    sorted_ids = torch.empty(capacity, **kw)
    experts_ids = torch.empty((capacity + block_size - 1) // block_size, **kw)
    total = torch.empty(1, **kw)
    torch.ops._moe_C.moe_align_block_size(
        topk_ids, num_experts, block_size, sorted_ids, experts_ids, total, expert_map
    )
    return sorted_ids, experts_ids, total


def moe_align_block_size_ref(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    capacity: int | None = None,
    num_blocks: int | None = None,
    expert_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain-torch moe_align_block_size with the same contract (a stable sort by expert key);
    capacity and num_blocks default to the smallest the op accepts. Shapes do not depend on the
    data, so it traces under torch.compile."""
    numel = topk_ids.numel()
    if capacity is None:
        capacity = moe_align_capacity(numel, num_experts, block_size)
    if num_blocks is None:
        num_blocks = (capacity + block_size - 1) // block_size
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < num_experts)
    keys = torch.where(valid, flat, 0)
    if expert_map is not None:
        keys = expert_map.long()[keys]
        valid &= (keys >= 0) & (keys < num_experts)
    keys = torch.where(valid, keys, num_experts)  # dropped entries sort last, as key E
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, keys, torch.ones_like(keys))
    padded = (counts + block_size - 1) // block_size * block_size
    padded[num_experts] = 0
    starts = torch.cumsum(padded, 0) - padded
    raw_starts = torch.cumsum(counts, 0) - counts
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    rank = torch.arange(numel, device=device) - raw_starts[sorted_keys]
    dest = torch.where(sorted_keys < num_experts, starts[sorted_keys] + rank, capacity)
    sorted_ids = torch.full((capacity + 1,), numel, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    total = padded.sum()
    block_start = torch.arange(num_blocks, device=device) * block_size
    ends = torch.cumsum(padded[:num_experts], 0)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    experts_ids = torch.where(block_start < total, block_expert, -1).to(torch.int32)
    return sorted_ids[:capacity], experts_ids, total.to(torch.int32).reshape(1)
