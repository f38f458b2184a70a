"""Kernels launched with programmatic dependent launch (kernels/common/launch.cuh), in a chain
where each reads what the one before it wrote: fused_add_rms_norm, silu_and_mul, the dynamic fp8
quantization (two kernels) and moe_sum. Replayed from a CUDA graph on fresh inputs, and run with
APHRODITE_PDL=0, the chain gives the eager run's results bit for bit (a kernel that touched
memory before its wait would read a stale input now and then)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import aphrodite_ext

FAMILIES = ("activation", "layernorm", "fp8_quant", "moe_sum")
TOKENS, HIDDEN, TOPK = 37, 2 * 1544, 4  # odd sizes; 1544 = 8 x 193 (16-byte vectors of bf16)


@pytest.fixture(autouse=True)
def _cuda_families(device):
    if device != "cuda":
        pytest.skip("programmatic dependent launch is a CUDA launch")
    missing = [why for built, why in map(aphrodite_ext.family_status, FAMILIES) if not built]
    if missing:
        pytest.skip("; ".join(missing))
    aphrodite_ext.load("_C")
    aphrodite_ext.load("_moe_C")


def chain(x, residual, weight, experts, out):
    """Each step reads the previous step's output; writes into `out`'s tensors."""
    torch.ops._C.fused_add_rms_norm(x, residual, weight, 1e-6)  # x, residual in place
    torch.ops._C.silu_and_mul(out["act"], x)
    torch.ops._C.dynamic_scaled_fp8_quant(out["q"], out["act"], out["scale"])
    experts.copy_(out["q"].float().view(TOKENS, 1, HIDDEN // 2).expand(-1, TOPK, -1))
    torch.ops._moe_C.moe_sum(experts.to(x.dtype), out["sum"])


def make(device, dtype=torch.bfloat16):
    inputs = {
        "x": torch.randn(TOKENS, HIDDEN, dtype=dtype, device=device),
        "residual": torch.randn(TOKENS, HIDDEN, dtype=dtype, device=device),
        "weight": torch.rand(HIDDEN, dtype=dtype, device=device) + 0.5,
    }
    out = {
        "act": torch.empty(TOKENS, HIDDEN // 2, dtype=dtype, device=device),
        "q": torch.empty(TOKENS, HIDDEN // 2, dtype=torch.float8_e4m3fn, device=device),
        "scale": torch.empty(1, dtype=torch.float32, device=device),
        "sum": torch.empty(TOKENS, HIDDEN // 2, dtype=dtype, device=device),
    }
    experts = torch.empty(TOKENS, TOPK, HIDDEN // 2, dtype=torch.float32, device=device)
    return inputs, out, experts


def results(inputs, out):
    tensors = [inputs["x"], inputs["residual"], out["act"], out["q"].view(torch.uint8)]
    return [t.clone() for t in tensors] + [out["scale"].clone(), out["sum"].clone()]


def test_graph_replay_matches_eager(device):
    inputs, out, experts = make(device)
    static = {k: v.clone() for k, v in inputs.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        chain(**{k: v.clone() for k, v in static.items()}, experts=experts, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(**static, experts=experts, out=out)
    for _ in range(5):
        fresh, _, _ = make(device)
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        got = results(static, out)
        chain(**fresh, experts=experts, out=out)
        want = results(fresh, out)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


_SCRIPT = """
import sys, hashlib, torch
sys.path.insert(0, {tests!r})
import test_launch as t
import aphrodite_ext
aphrodite_ext.load("_C"); aphrodite_ext.load("_moe_C")
torch.manual_seed({seed})
inputs, out, experts = t.make("cuda")
for _ in range(3):
    t.chain(**inputs, experts=experts, out=out)
torch.cuda.synchronize()
digest = hashlib.sha256()
for r in t.results(inputs, out):
    digest.update(r.cpu().contiguous().view(torch.uint8).numpy().tobytes())
print(digest.hexdigest())
"""


def test_plain_launches_give_the_same_results(device):
    seed = torch.randint(0, 2**31, ()).item()
    script = _SCRIPT.format(tests=os.path.dirname(__file__), seed=seed)
    digests = []
    for pdl in ("0", "1"):
        env = {**os.environ, "APHRODITE_PDL": pdl}
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr
        digests.append(proc.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1], f"APHRODITE_PDL=0 and 1 differ (seed {seed})"
