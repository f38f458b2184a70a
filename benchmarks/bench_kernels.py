"""Our first-tenant kernels against what a user would pick instead, side by side in one run:
torch eager and torch.compile of the same function. Bandwidth-bound ops report achieved
bytes/s (each input read once, each output written once) and the device copy's rate.

    python benchmarks/bench_kernels.py [--device cuda|cpu] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import aphrodite_ext  # noqa: E402


def _rms_ref(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _fused_ref(x, r, w, eps=1e-6):
    r = (x.float() + r.float()).to(x.dtype)
    return _rms_ref(r, w, eps), r


def _silu_ref(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _gelu_ref(x):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def _topk_ref(g, k):
    w, i = torch.softmax(g.float(), -1).topk(k, -1)
    return w / w.sum(-1, keepdim=True), i.int()


def cases(device, large_tokens, hidden, inter, decode):
    bf16 = dict(dtype=torch.bfloat16, device=device)
    for tokens in [large_tokens, *decode]:
        x = torch.randn(tokens, hidden, **bf16)
        w = torch.randn(hidden, **bf16)
        out = torch.empty_like(x)
        yield (
            "rms_norm",
            tokens,
            hidden,
            2 * x.numel() * 2,
            lambda x=x, w=w, out=out: torch.ops._C.rms_norm(out, x, w, 1e-6),
            lambda x=x, w=w: _rms_ref(x, w),
        )
        r = torch.randn_like(x)
        yield (
            "fused_add_rms_norm",
            tokens,
            hidden,
            4 * x.numel() * 2,
            lambda x=x, r=r, w=w: torch.ops._C.fused_add_rms_norm(x, r, w, 1e-6),
            lambda x=x, r=r, w=w: _fused_ref(x, r, w),
        )
        a = torch.randn(tokens, 2 * inter, **bf16)
        o = torch.empty(tokens, inter, **bf16)
        for name, ref in [("silu_and_mul", _silu_ref), ("gelu_and_mul", _gelu_ref)]:
            op = getattr(torch.ops._C, name)
            yield (
                name,
                tokens,
                inter,
                3 * o.numel() * 2,
                lambda a=a, o=o, op=op: op(o, a),
                lambda a=a, ref=ref: ref(a),
            )
    for tokens in [1, 16, 256, 4096]:
        for experts, k in [(64, 2), (256, 8)]:
            g = torch.randn(tokens, experts, device=device)
            tw = torch.empty(tokens, k, device=device)
            ti = torch.empty(tokens, k, dtype=torch.int32, device=device)
            ts = torch.empty_like(ti)
            yield (
                f"topk_softmax e{experts} k{k}",
                tokens,
                experts,
                g.numel() * 4,
                lambda g=g, tw=tw, ti=ti, ts=ts: torch.ops._moe_C.topk_softmax(tw, ti, ts, g, True),
                lambda g=g, k=k: _topk_ref(g, k),
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = args.device
    aphrodite_ext.load("_C")
    aphrodite_ext.load("_moe_C")
    if device == "cuda":
        shape = dict(large_tokens=8192, hidden=8192, inter=28672, decode=[1, 16, 64])
        reps = 200
    else:
        shape = dict(large_tokens=4096, hidden=4096, inter=11008, decode=[1, 16])
        reps = 10
    rows = []
    copy_gbs = None
    if device == "cuda":
        src = torch.empty(2**28, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        ms = harness.median_ms(lambda: dst.copy_(src), device, reps=50)
        copy_gbs = 2 * src.numel() * 4 / ms / 1e6
    for name, tokens, width, nbytes, ours, ref in cases(device, **shape):
        compiled = torch.compile(ref, dynamic=False)
        t_ours = harness.median_ms(ours, device, reps=reps)
        t_eager = harness.median_ms(ref, device, reps=reps)
        t_comp = harness.median_ms(compiled, device, reps=reps)
        gbs = nbytes / t_ours / 1e6
        rows.append(
            [
                name,
                tokens,
                width,
                f"{t_ours * 1e3:.1f}",
                f"{t_comp * 1e3:.1f}",
                f"{t_eager * 1e3:.1f}",
                f"{gbs:.0f}",
                f"{t_comp / t_ours:.2f}x",
                f"{t_eager / t_ours:.2f}x",
            ]
        )
        print(" | ".join(map(str, rows[-1])), flush=True)
    notes = (
        f"device copy: {copy_gbs:.0f} GB/s (read + write)" if copy_gbs else ""
    ) + f"; threads {torch.get_num_threads()}; ISA {os.environ.get('APHRODITE_CPU_ISA', 'auto')}"
    text = harness.write(
        "kernels",
        device,
        [
            "op",
            "tokens",
            "width",
            "ours us",
            "torch.compile us",
            "eager us",
            "ours GB/s",
            "vs compile",
            "vs eager",
        ],
        rows,
        args.out,
        notes,
    )
    print(text)


if __name__ == "__main__":
    main()
