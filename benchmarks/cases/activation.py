"""silu_and_mul, gelu_and_mul and gelu_tanh_and_mul at [tokens, 2 * inter] in bf16."""

import torch
import torch.nn.functional as F

from . import Case


def _silu_ref(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _gelu_ref(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def _gelu_tanh_ref(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def cases(device, shape):
    for tokens in [shape.large_tokens, *shape.decode]:
        a = torch.randn(tokens, 2 * shape.inter, dtype=torch.bfloat16, device=device)
        o = torch.empty(tokens, shape.inter, dtype=torch.bfloat16, device=device)
        for name, ref in [
            ("silu_and_mul", _silu_ref),
            ("gelu_and_mul", _gelu_ref),
            ("gelu_tanh_and_mul", _gelu_tanh_ref),
        ]:
            op = getattr(torch.ops._C, name)
            yield Case(
                name,
                tokens,
                shape.inter,
                3 * o.numel() * 2,
                lambda a=a, o=o, op=op: op(o, a),
                lambda a=a, ref=ref: ref(a),
            )
