"""topk_softmax (renormalised) for 64 experts top-2 and 256 experts top-8, fp32 logits."""

import torch

from . import Case


def _topk_ref(g, k):
    w, i = torch.softmax(g.float(), -1).topk(k, -1)
    return w / w.sum(-1, keepdim=True), i.int()


def cases(device, shape):
    for tokens in [1, 16, 256, 4096]:
        for experts, k in [(64, 2), (256, 8)]:
            g = torch.randn(tokens, experts, device=device)
            tw = torch.empty(tokens, k, device=device)
            ti = torch.empty(tokens, k, dtype=torch.int32, device=device)
            ts = torch.empty_like(ti)
            yield Case(
                f"topk_softmax e{experts} k{k}",
                tokens,
                experts,
                g.numel() * 4,
                lambda g=g, tw=tw, ti=ti, ts=ts: torch.ops._moe_C.topk_softmax(tw, ti, ts, g, True),
                lambda g=g, k=k: _topk_ref(g, k),
            )
