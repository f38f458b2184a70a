"""Runs benchmark cases once each, ours and the peer, between cudaProfilerStart and
cudaProfilerStop, for Nsight Compute to read (caches flushed before each kernel, as in the
benchmarks). The kernels of a case come out in the order: ours, then the peer's. Cases: those of
benchmarks/cases (peer: torch.compile), and with --marlin the W4A16 GEMM at M = 1, 16, 64 and
128, 8192 x 28672 (peer: fp16 F.linear), with --paged CTX ... paged_attention_v1 on
bench_paged_attention's problem at batch 32 and each context (peer: SDPA with enable_gqa on the
contiguous KV), with --flash the flash-attention forward at S 4096, batch 4, 32 heads, d 128,
bf16, non-causal (peer: SDPA's flash backend), then the same work on a shuffled paged K/V cache
of 16-row blocks (peer: our dense forward).

    ncu --profile-from-start off --clock-control none --section ... \\
        python tools/profile_kernels.py [--family NAME ...] [--tokens 1 16 ...] [--op NAME ...]
                                        [--marlin] [--paged CTX ...] [--flash] [--no-cases]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from cases import all_cases  # noqa: E402

import aphrodite_ext  # noqa: E402


def profiled(name: str, ours, peer) -> None:
    """Warms both up, then runs each once inside the profiled range."""
    for _ in range(3):  # compile, autotune, warm
        ours()
        peer()
    torch.cuda.synchronize()
    print(f"case {name}", file=sys.stderr, flush=True)
    cudart = torch.cuda.cudart()
    cudart.cudaProfilerStart()
    ours()
    torch.cuda.synchronize()
    peer()
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()


def marlin_cases() -> None:
    from aphrodite_ext.ops import marlin

    k, n, group = 8192, 28672, 128
    w = torch.randn(k, n, device="cuda") * 0.05
    q = marlin.quantize_weights(w, "uint4b8", group, scale_dtype=torch.float16)
    packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), None, k, n)
    w_fp16 = q["w_ref"].to(torch.float16).t().contiguous()
    ws = marlin.make_workspace(torch.device("cuda"))
    for m in (1, 16, 64, 128):
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        profiled(
            f"marlin M={m} K={k} N={n}",
            lambda a=a: marlin.gptq_marlin_gemm(a, packed, q["scales"], ws, "uint4b8"),
            lambda a=a: F.linear(a, w_fp16),
        )


def paged_cases(contexts: list[int]) -> None:
    import bench_paged_attention as bench

    gen = torch.Generator().manual_seed(0)
    for ctx in contexts:
        pb = bench.Problem(32, ctx, gen)
        profiled(f"paged_attention_v1 batch 32 ctx {ctx}", pb.v1, pb.sdpa_gqa)
        del pb


def flash_cases() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from aphrodite_ext.ops.flash_attn import flash_attn_varlen_func

    batch, heads, seq, d = 4, 32, 4096, 128
    q, k, v = (
        torch.randn(batch * seq, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)
    )
    cu = torch.arange(0, batch * seq + 1, seq, dtype=torch.int32, device="cuda")
    qs, ks, vs = (t.view(batch, seq, heads, d).transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qs, ks, vs)

    def dense():
        return flash_attn_varlen_func(q, k, v, cu, cu, seq, seq)

    profiled(f"flash_attn S={seq} d={d}", dense, sdpa)

    block = 16
    order = torch.randperm(batch * seq // block, device="cuda")
    kc, vc = (
        torch.empty(batch * seq // block, block, heads, d, device="cuda", dtype=q.dtype)
        for _ in range(2)
    )
    kc[order], vc[order] = k.view(-1, block, heads, d), v.view(-1, block, heads, d)
    table = order.view(batch, -1).int()
    profiled(
        f"flash_attn paged bs{block} S={seq} d={d} (peer: dense)",
        lambda: flash_attn_varlen_func(q, kc, vc, cu, cu, seq, seq, block_table=table),
        dense,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", nargs="*")
    parser.add_argument("--tokens", nargs="*", type=int)
    parser.add_argument("--op", nargs="*")
    parser.add_argument("--marlin", action="store_true")
    parser.add_argument("--paged", nargs="*", type=int, metavar="CTX")
    parser.add_argument("--flash", action="store_true")
    parser.add_argument("--no-cases", action="store_true", help="skip benchmarks/cases")
    args = parser.parse_args()
    for module in ("_C", "_moe_C"):
        aphrodite_ext.load(module)
    if args.marlin:
        marlin_cases()
    if args.paged:
        paged_cases(args.paged)
    if args.flash:
        aphrodite_ext.load("_fa2_C")
        flash_cases()
    if args.no_cases:
        return
    for case in all_cases("cuda", args.family):
        if args.tokens and case.tokens not in args.tokens:
            continue
        if args.op and case.op not in args.op:
            continue
        torch._dynamo.reset()
        profiled(
            f"{case.op} tokens={case.tokens}",
            case.ours,
            torch.compile(case.ref, dynamic=False),
        )


if __name__ == "__main__":
    main()
