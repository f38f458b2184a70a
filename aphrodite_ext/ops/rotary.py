"""Rotary position embedding, in place on query and key (kernels/rotary)."""

from __future__ import annotations

import torch

from .. import load


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotates the first rot_dim = cos_sin_cache.shape[-1] elements of every head of query and
    key in place, by the angles of row positions[t] of cos_sin_cache (cos in its first half, sin
    in its second). is_neox pairs x[i] with x[i + rot_dim/2], otherwise x[2i] with x[2i+1].
    query/key: [*positions.shape, heads * head_size] or [*positions.shape, heads, head_size],
    any token and head strides, contiguous last dimension. Returns (query, key).

    On the GPU, positions outside [0, max_position) are not checked: those tokens are left
    unchanged. The CPU backend raises for them."""
    load("_C")
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    return query, key


def rotary_embedding_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New (query, key) rotated in fp32 and rounded once; the inputs are not modified and the
    elements past rot_dim are copied unchanged."""
    pos = positions.flatten().long()
    rot_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[pos].float().chunk(2, dim=-1)  # [tokens, rot_dim / 2] each
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        heads = x.reshape(pos.numel(), -1, head_size)
        rot = heads[..., :rot_dim].float()
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out.to(x.dtype), heads[..., rot_dim:]), dim=-1).reshape(x.shape)

    return rotate(query), None if key is None else rotate(key)
