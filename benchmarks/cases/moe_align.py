"""moe_align_block_size (block size 64) for top-k routing of 1..4096 tokens over 64 and 256
experts, against the plain-torch stable sort (ops/moe_align.py's reference)."""

import torch

from aphrodite_ext.ops.moe_align import moe_align_block_size_ref, moe_align_capacity

from . import Case

BLOCK = 64


def cases(device, shape):
    for tokens in [1, 16, 256, 4096]:
        for experts in [64, 256]:
            for k in [2, 8]:
                ids = torch.rand(tokens, experts).topk(k, -1).indices.int().to(device)
                cap = moe_align_capacity(ids.numel(), experts, BLOCK)
                blocks = (cap + BLOCK - 1) // BLOCK
                kw = dict(dtype=torch.int32, device=device)
                s = torch.empty(cap, **kw)
                e = torch.empty(blocks, **kw)
                t = torch.empty(1, **kw)
                yield Case(
                    f"moe_align_block_size e{experts} k{k}",
                    tokens,
                    experts,
                    4 * (ids.numel() + cap + blocks + 1),
                    lambda ids=ids, experts=experts, s=s, e=e, t=t: (
                        torch.ops._moe_C.moe_align_block_size(ids, experts, BLOCK, s, e, t, None)
                    ),
                    lambda ids=ids, experts=experts: moe_align_block_size_ref(ids, experts, BLOCK),
                )
