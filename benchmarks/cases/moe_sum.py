"""moe_sum of bf16 expert outputs, top-8, [tokens, 8, hidden] -> [tokens, hidden]."""

import torch

from aphrodite_ext.ops.moe_sum import moe_sum_ref

from . import Case

TOPK = 8


def cases(device, shape):
    for tokens in [shape.large_tokens, *shape.decode]:
        x = torch.randn(tokens, TOPK, shape.hidden, dtype=torch.bfloat16, device=device)
        out = torch.empty(tokens, shape.hidden, dtype=torch.bfloat16, device=device)
        yield Case(
            f"moe_sum k{TOPK}",
            tokens,
            shape.hidden,
            (x.numel() + out.numel()) * 2,
            lambda x=x, out=out: torch.ops._moe_C.moe_sum(x, out),
            lambda x=x: moe_sum_ref(x),
        )
