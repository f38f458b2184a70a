"""Marlin W4A16 GEMM against fp16 cuBLAS (torch.nn.functional.linear) and torch's own int4
weight-only matmul (aten._weight_int4pack_mm, bf16 activations), group size 128, in one run.
Checks our output against the fp32 reference once per shape before timing. Writes
results/marlin_<device>.md/.json through the harness.

    python benchmarks/bench_marlin.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import aphrodite_ext  # noqa: E402
from aphrodite_ext.ops import marlin  # noqa: E402

MS = [1, 16, 32, 64, 128, 256]
SHAPES = [(4096, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]
GROUP = 128


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: read + write bytes per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = harness.median_ms(lambda: dst.copy_(src), "cuda", warmup=3, reps=20)
    return 2 * src.numel() / ms / 1e6


def int4pack_weight(k: int, n: int):
    """torch's tinygemm layout: uint8 [N, K / 2] (even k in the high nibble) packed by
    _convert_weight_to_int4pack(w, innerKTiles=8), and bf16 [K / group, N, 2] scales+zeros."""
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
    u8 = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(u8, 8)
    sz = torch.empty(k // GROUP, n, 2, dtype=torch.bfloat16, device="cuda")
    sz[..., 0].uniform_(0.001, 0.01)
    sz[..., 1].zero_()
    return packed, sz


def bench_shape(k: int, n: int, ms_list: list[int], ws: torch.Tensor, copy_gbs: float):
    """Rows for one (K, N): checks our output against the fp32 reference once, then times."""
    w = torch.randn(k, n, device="cuda") * 0.05
    q = marlin.quantize_weights(w, "uint4b8", GROUP, scale_dtype=torch.float16)
    packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), None, k, n)
    scales = q["scales"]
    w_fp16 = q["w_ref"].to(torch.float16).t().contiguous()  # [N, K] as nn.Linear holds it
    try:
        tp_w, tp_sz = int4pack_weight(k, n)
    except RuntimeError as e:  # the peer's private op may change between torch releases
        print(f"torch int4 weight-only mm unavailable: {e}", flush=True)
        tp_w = tp_sz = None
    rows = []
    for i, m in enumerate(ms_list):
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        a_bf16 = a.to(torch.bfloat16)

        def ours(a=a):
            return marlin.gptq_marlin_gemm(a, packed, scales, ws, "uint4b8")

        if i == 0:
            ref = marlin.gemm_ref(a, q["w_ref"])
            err = ((ours().float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                raise SystemExit(f"K={k} N={n} M={m}: relative error {err:.3g} >= 1e-2")
        t_ours = harness.median_ms(ours, "cuda")
        t_fp16 = harness.median_ms(lambda a=a: F.linear(a, w_fp16), "cuda")
        t_int4 = float("nan")
        if tp_w is not None:
            t_int4 = harness.median_ms(
                lambda x=a_bf16: torch.ops.aten._weight_int4pack_mm(x, tp_w, GROUP, tp_sz), "cuda"
            )
        weight_bytes = k * n // 2 + scales.numel() * 2
        gbs = weight_bytes / t_ours / 1e6
        rows.append(
            [
                m,
                k,
                n,
                f"{t_ours:.4f}",
                f"{t_fp16:.4f}",
                f"{t_int4:.4f}",
                f"{t_fp16 / t_ours:.2f}",
                f"{t_int4 / t_ours:.2f}",
                f"{gbs:.0f}" + (f" ({gbs / copy_gbs:.0%})" if m == 1 else ""),
            ]
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="first shape and M in {1, 16} only")
    parser.add_argument("--out", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    aphrodite_ext.load("_C")
    ms_list, shapes = (MS[:2], SHAPES[:1]) if args.quick else (MS, SHAPES)
    copy_gbs = copy_bandwidth_gbs()
    ws = marlin.make_workspace("cuda")
    rows = []
    for k, n in shapes:
        rows += bench_shape(k, n, ms_list, ws, copy_gbs)
        torch.cuda.empty_cache()
    notes = (
        f"group size {GROUP}, uint4b8 weights, fp16 activations (torch int4: bf16). "
        f"Weight GB/s = (packed weight + scales bytes) / time; at M = 1 also as a fraction of "
        f"the 1 GiB device copy rate measured in this run ({copy_gbs:.0f} GB/s, read+write)."
    )
    header = [
        "M",
        "K",
        "N",
        "ours ms",
        "fp16 linear ms",
        "torch int4 ms",
        "x vs fp16",
        "x vs torch int4",
        "weight GB/s",
    ]
    print(harness.write("marlin", "cuda", header, rows, out_dir=args.out, notes=notes))


if __name__ == "__main__":
    main()
