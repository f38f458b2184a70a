"""Our kernels against what a user would pick instead, side by side in one run: torch eager
and torch.compile of the same function. Each family's cases live in benchmarks/cases/<family>.py.
Bandwidth-bound ops report achieved bytes/s (each input read once, each output written once)
beside the device copy's rate. On a GPU the decode sizes are timed two more ways: as calls
replayed back to back from a CUDA graph (harness.graph_ms), as a served decode step runs them,
and the same with a torch op before each call (what the call adds to it), since ours start early
(programmatic dependent launch) where the kernel before them ends.

    python benchmarks/bench_kernels.py [--device cuda|cpu] [--family NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from cases import SHAPES, all_cases  # noqa: E402

import aphrodite_ext  # noqa: E402

HEADER = [
    "op",
    "tokens",
    "width",
    "ours us",
    "torch.compile us",
    "eager us",
    "ours GB/s",
    "vs compile",
    "vs eager",
    "ours graph us",
    "compile graph us",
    "vs compile, graph",
    "ours / compile graph us, after a torch op",
    "vs compile, after a torch op",
]


def copy_gbs(device: str) -> float:
    """The device's memory-copy rate, bytes read plus bytes written, in GB/s."""
    src = torch.empty(2**28 if device == "cuda" else 2**25, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = harness.median_ms(lambda: dst.copy_(src), device, reps=50 if device == "cuda" else 10)
    return 2 * src.numel() * 4 / ms / 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--family", nargs="*", help="only these families (module names in cases/)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = args.device
    for module in ("_C", "_moe_C"):
        aphrodite_ext.load(module)
    reps = 200 if device == "cuda" else 10
    rows = []
    if device == "cuda":
        # A kernel of someone else's for the decode sizes' second graph timing to follow: one
        # eager elementwise op, which (as torch's kernels) starts only once the one before ends.
        other = torch.zeros(4096, device=device)
        torch_op = lambda: other.add_(1.0)
    for case in all_cases(device, args.family):
        # A fresh dynamo state per case: the cases' lambdas share code objects, and past the
        # recompile limit dynamo would run the rest in eager mode and call that torch.compile.
        torch._dynamo.reset()
        compiled = torch.compile(case.ref, dynamic=False)
        t_ours = harness.median_ms(case.ours, device, reps=reps)
        t_eager = harness.median_ms(case.ref, device, reps=reps)
        t_comp = harness.median_ms(compiled, device, reps=reps)
        graph = ["-"] * 5
        if device == "cuda" and case.tokens in SHAPES[device].decode:
            g_ours, g_comp = harness.graph_ms(case.ours), harness.graph_ms(compiled)
            a_ours = harness.graph_ms(case.ours, after=torch_op)
            a_comp = harness.graph_ms(compiled, after=torch_op)
            graph = [
                f"{g_ours * 1e3:.2f}" if g_ours else "n/a",
                f"{g_comp * 1e3:.2f}" if g_comp else "n/a",
                f"{g_comp / g_ours:.2f}x" if g_ours and g_comp else "-",
                f"{a_ours * 1e3:.2f} / {a_comp * 1e3:.2f}" if a_ours and a_comp else "n/a",
                f"{a_comp / a_ours:.2f}x" if a_ours and a_comp else "-",
            ]
        rows.append(
            [
                case.op,
                case.tokens,
                case.width,
                f"{t_ours * 1e3:.1f}",
                f"{t_comp * 1e3:.1f}",
                f"{t_eager * 1e3:.1f}",
                f"{case.nbytes / t_ours / 1e6:.0f}",
                f"{t_comp / t_ours:.2f}x",
                f"{t_eager / t_ours:.2f}x",
                *graph,
            ]
        )
        print(" | ".join(map(str, rows[-1])), flush=True)
    notes = (
        f"device copy: {copy_gbs(device):.0f} GB/s (read + write); "
        f"threads {torch.get_num_threads()}; ISA {os.environ.get('APHRODITE_CPU_ISA', 'auto')}"
    )
    name = "kernels" if not args.family else "kernels_" + "_".join(args.family)
    print(harness.write(name, device, HEADER, rows, args.out, notes))


if __name__ == "__main__":
    main()
