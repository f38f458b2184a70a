"""Marlin W4A16 GEMM against fp16 cuBLAS (torch.nn.functional.linear) and torch's own int4
weight-only matmul (aten._weight_int4pack_mm, bf16 activations), group size 128, in one run.
Checks our output against the fp32 reference once per shape before timing. Writes
results/marlin_<device>.md/.json through the harness.

    python benchmarks/bench_marlin.py [--quick] [--out DIR]
    python benchmarks/bench_marlin.py --sweep [--quick]

--quick: M in {1, 16, 32, 64, 128} and the two K = 8192 shapes only.
--sweep: for M in {1, 16, 32, 64, 128} (or --ms ...) and (K, N) in {(4096, 4096), (8192, 8192),
(8192, 28672), (28672, 8192)} (add --quick for M in {1, 16} only), times every (thread-block shape, split or stream-K) the
dispatch could pick, forcing each through APHRODITE_MARLIN_CONFIG (a tuning override read by the
op), checks each against the fp32 reference, and prints one line per case: the dispatch's own
pick, the best configuration, and all of them. Sweep times are the mean of back-to-back calls (no
host gap between calls).
"""

from __future__ import annotations

import argparse
import os
import re
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


SWEEP_MS = [1, 16, 32, 64, 128]
SWEEP_SHAPES = [(4096, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]
# (block rows, name) of every block shape codegen/marlin.py declares; the k2 shapes are 8-warp
# twins of the 4-warp ones, the w shapes the sm_90a wgmma blocks and m16n256t the sm_90a TMA-fed
# decode block (built for 9.0a only).
BLOCK_SHAPES = [
    (int(re.match(r"m(\d+)", name)[1]), name)
    for name in harness.generator_choices("marlin")["shapes"]
]
# Config suffixes per block shape: none (the heuristic's split), ":<splits>" (split-K) and ":sk"
# (stream-K over the blocks resident at once).
SPLITS = [None, 1, 2, 3, 4, 6, 8, 12, 16, 24, "sk"]
CONFIG_ENV = "APHRODITE_MARLIN_CONFIG"


def loop_ms(fn, reps: int = 50) -> float:
    """Mean ms of `reps` back-to-back calls (the GPU never waits for the host between them)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def sweep_shape(k: int, n: int, ms_list: list[int], ws: torch.Tensor) -> None:
    """One table line per M for one (K, N)."""
    w = torch.randn(k, n, device="cuda") * 0.05
    q = marlin.quantize_weights(w, "uint4b8", GROUP, scale_dtype=torch.float16)
    packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), None, k, n)
    scales = q["scales"]
    w_fp16 = q["w_ref"].to(torch.float16).t().contiguous()
    for m in ms_list:
        a = torch.randn(m, k, dtype=torch.float16, device="cuda")
        ref = marlin.gemm_ref(a, q["w_ref"])

        def ours(a=a):
            return marlin.gptq_marlin_gemm(a, packed, scales, ws, "uint4b8")

        t_fp16 = loop_ms(lambda a=a: F.linear(a, w_fp16))
        t_default = loop_ms(ours)
        results = {}
        # Block heights from half the smallest that covers M (at least 16) up to twice it.
        shapes = [s for r, s in BLOCK_SHAPES if max(16, m) // 2 <= r <= 2 * max(16, m)]
        for shape in shapes:
            for splits in SPLITS:
                cfg = shape + ("" if splits is None else f":{splits}")
                os.environ[CONFIG_ENV] = cfg
                try:
                    out = ours()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        raise SystemExit(f"{cfg} K={k} N={n} M={m}: relative error {err:.3g}")
                    results[cfg] = loop_ms(ours)
                except RuntimeError as e:
                    if "does not hold" in str(e) or "sm_90 only" in str(e):
                        break  # this block shape is not in the build, or not for this GPU
                    raise
                finally:
                    os.environ.pop(CONFIG_ENV, None)
        best = min(results, key=results.get)
        listing = " ".join(f"{c}={t:.4f}" for c, t in sorted(results.items(), key=lambda x: x[1]))
        print(
            f"| {m} | {k} | {n} | {t_fp16:.4f} | {t_default:.4f} | {best} | "
            f"{results[best]:.4f} | {t_fp16 / results[best]:.2f} | {listing} |",
            flush=True,
        )


def sweep(ms_list: list[int], ws: torch.Tensor) -> None:
    os.environ.pop(CONFIG_ENV, None)
    print("| M | K | N | fp16 ms | default ms | best config | best ms | x vs fp16 | all (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n in SWEEP_SHAPES:
        sweep_shape(k, n, ms_list, ws)
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="M in {1, 16, 32, 64, 128}, the K = 8192 shapes only"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="time every (block shape, split) per case"
    )
    parser.add_argument(
        "--ms", type=int, nargs="+", default=None, help="--sweep: these M instead of the default"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    aphrodite_ext.load("_C")
    ws = marlin.make_workspace("cuda")
    if args.sweep:
        sweep(args.ms or (SWEEP_MS[:2] if args.quick else SWEEP_MS), ws)
        return
    if args.quick:
        ms_list, shapes = SWEEP_MS, [s for s in SHAPES if s[0] == 8192]
    else:
        ms_list, shapes = MS, SHAPES
    copy_gbs = copy_bandwidth_gbs()
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
