"""rms_norm and fused_add_rms_norm at [tokens, hidden] in bf16."""

import torch

from . import Case


def _rms_ref(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _fused_ref(x, r, w, eps=1e-6):
    r = (x.float() + r.float()).to(x.dtype)
    return _rms_ref(r, w, eps), r


def cases(device, shape):
    for tokens in [shape.large_tokens, *shape.decode]:
        x = torch.randn(tokens, shape.hidden, dtype=torch.bfloat16, device=device)
        w = torch.randn(shape.hidden, dtype=torch.bfloat16, device=device)
        out = torch.empty_like(x)
        r = torch.randn_like(x)
        yield Case(
            "rms_norm",
            tokens,
            shape.hidden,
            2 * x.numel() * 2,
            lambda x=x, w=w, out=out: torch.ops._C.rms_norm(out, x, w, 1e-6),
            lambda x=x, w=w: _rms_ref(x, w),
        )
        yield Case(
            "fused_add_rms_norm",
            tokens,
            shape.hidden,
            4 * x.numel() * 2,
            lambda x=x, r=r, w=w: torch.ops._C.fused_add_rms_norm(x, r, w, 1e-6),
            lambda x=x, r=r, w=w: _fused_ref(x, r, w),
        )
