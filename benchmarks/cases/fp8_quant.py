"""static, dynamic per-tensor and dynamic per-token fp8 quantization of bf16 [tokens, hidden]."""

import torch

import aphrodite_ext
from aphrodite_ext.ops.fp8_quant import (
    FP8_DTYPE,
    dynamic_per_token_scaled_fp8_quant_ref,
    dynamic_scaled_fp8_quant_ref,
    static_scaled_fp8_quant_ref,
)

from . import Case


def _serves(device):
    """Whether this install runs fp8_quant on `device`: the family is built, for its backend."""
    backend = aphrodite_ext.build_info().get("backend")
    return aphrodite_ext.family_status("fp8_quant")[0] and (backend == "cpu") == (device == "cpu")


def cases(device, shape):
    if not _serves(device):
        return
    for tokens in [shape.large_tokens, *shape.decode]:
        x = torch.randn(tokens, shape.hidden, dtype=torch.bfloat16, device=device)
        out = torch.empty(x.shape, dtype=FP8_DTYPE, device=device)
        moved = x.numel() * 2 + out.numel()  # bf16 read, fp8 written
        scale = (x.float().abs().amax() / 448).reshape(1)
        yield Case(
            "static_scaled_fp8_quant",
            tokens,
            shape.hidden,
            moved + 4,
            lambda x=x, out=out, s=scale: torch.ops._C.static_scaled_fp8_quant(out, x, s),
            lambda x=x, s=scale: static_scaled_fp8_quant_ref(x, s),
        )
        tensor_scale = torch.empty(1, dtype=torch.float32, device=device)
        yield Case(
            "dynamic_scaled_fp8_quant",
            tokens,
            shape.hidden,
            moved + 4,
            lambda x=x, out=out, s=tensor_scale: torch.ops._C.dynamic_scaled_fp8_quant(out, x, s),
            lambda x=x: dynamic_scaled_fp8_quant_ref(x),
        )
        token_scale = torch.empty(tokens, 1, dtype=torch.float32, device=device)
        yield Case(
            "dynamic_per_token_scaled_fp8_quant",
            tokens,
            shape.hidden,
            moved + tokens * 4,
            lambda x=x, out=out, s=token_scale: torch.ops._C.dynamic_per_token_scaled_fp8_quant(
                out, x, s, None
            ),
            lambda x=x: dynamic_per_token_scaled_fp8_quant_ref(x),
        )
