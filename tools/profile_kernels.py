"""Runs benchmark cases once each, ours and the torch.compile peer, between cudaProfilerStart and
cudaProfilerStop, for Nsight Compute to read (caches flushed before each kernel, as in the
benchmarks). The kernels of a case come out in the order: ours, then the peer's.

    ncu --profile-from-start off --clock-control none --section ... \\
        python tools/profile_kernels.py [--family NAME ...] [--tokens 1 16 ...] [--op NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from cases import all_cases  # noqa: E402

import aphrodite_ext  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", nargs="*")
    parser.add_argument("--tokens", nargs="*", type=int)
    parser.add_argument("--op", nargs="*")
    args = parser.parse_args()
    for module in ("_C", "_moe_C"):
        aphrodite_ext.load(module)
    cudart = torch.cuda.cudart()
    for case in all_cases("cuda", args.family):
        if args.tokens and case.tokens not in args.tokens:
            continue
        if args.op and case.op not in args.op:
            continue
        torch._dynamo.reset()
        compiled = torch.compile(case.ref, dynamic=False)
        for _ in range(3):  # compile, autotune, warm
            case.ours()
            compiled()
        torch.cuda.synchronize()
        print(f"case {case.op} tokens={case.tokens}", file=sys.stderr, flush=True)
        cudart.cudaProfilerStart()
        case.ours()
        torch.cuda.synchronize()
        compiled()
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()


if __name__ == "__main__":
    main()
