"""Runs paged_attention_v1 and v2 a few times on the benchmark's problem so that a profiler
(ncu) can read them: python tools/probe_paged_attention.py [ctx [batch]]."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_paged_attention as b  # noqa: E402

import aphrodite_ext  # noqa: E402

aphrodite_ext.load("_C")
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
pb = b.Problem(batch, ctx, torch.Generator().manual_seed(0))
for _ in range(3):
    pb.v1()
    pb.v2()
torch.cuda.synchronize()
