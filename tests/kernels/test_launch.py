"""Kernels launched with programmatic dependent launch (kernels/common/launch.cuh), in chains
where each kernel reads what the one before it wrote. Replayed from a CUDA graph on fresh inputs,
and run with APHRODITE_PDL=0, each chain gives the eager run's results bit for bit (a kernel that
touched memory before its wait would read a stale input now and then).

Two chains: `pointwise` (fused_add_rms_norm, silu_and_mul, the dynamic fp8 quantization's two
kernels, moe_sum) and `decode_layer`, one decode step of a small Llama-style layer on the marlin
GEMM and paged attention v2 (its split and reduce kernels) between the norm, rotary, cache and
activation kernels; the layer also with each of marlin's split sums forced (APHRODITE_MARLIN_CONFIG:
a cluster launch, a cooperative launch, a plain one), each carrying the PDL attribute."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from narrowed import skip_left_out

import aphrodite_ext
from aphrodite_ext.ops import marlin
from aphrodite_ext.ops.paged_attention import paged_attention


class Pointwise:
    families = ("activation", "layernorm", "fp8_quant", "moe_sum")
    TOKENS, HIDDEN, TOPK = 37, 2 * 1544, 4  # odd sizes; 1544 = 8 x 193 (16-byte vectors of bf16)

    def __init__(self, device, dtype=torch.bfloat16):
        t, h, dt = self.TOKENS, self.HIDDEN, dtype
        self.device, self.dtype = device, dtype
        self.act = torch.empty(t, h // 2, dtype=dt, device=device)
        self.q = torch.empty(t, h // 2, dtype=torch.float8_e4m3fn, device=device)
        self.scale = torch.empty(1, dtype=torch.float32, device=device)
        self.sum = torch.empty(t, h // 2, dtype=dt, device=device)
        self.experts = torch.empty(t, self.TOPK, h // 2, dtype=torch.float32, device=device)

    def inputs(self):
        t, h, dt, dev = self.TOKENS, self.HIDDEN, self.dtype, self.device
        return {
            "x": torch.randn(t, h, dtype=dt, device=dev),
            "residual": torch.randn(t, h, dtype=dt, device=dev),
            "weight": torch.rand(h, dtype=dt, device=dev) + 0.5,
        }

    def run(self, x, residual, weight):
        """Each step reads the previous step's output; returns what the chain wrote."""
        torch.ops._C.fused_add_rms_norm(x, residual, weight, 1e-6)  # x, residual in place
        torch.ops._C.silu_and_mul(self.act, x)
        torch.ops._C.dynamic_scaled_fp8_quant(self.q, self.act, self.scale)
        shape = (self.TOKENS, 1, self.HIDDEN // 2)
        self.experts.copy_(self.q.float().view(shape).expand(-1, self.TOPK, -1))
        torch.ops._moe_C.moe_sum(self.experts.to(x.dtype), self.sum)
        return [x, residual, self.act, self.q.view(torch.uint8), self.scale, self.sum]


class DecodeLayer:
    """rms_norm -> marlin (qkv) -> rotary on the q and k views -> reshape_and_cache -> paged
    attention v2 -> marlin (o) -> fused_add_rms_norm -> marlin (gate, up) -> silu_and_mul ->
    marlin (down), fp16, for SEQS sequences of odd lengths across v2's partitions."""

    families = ("activation", "layernorm", "rotary", "cache", "paged_attention", "marlin")
    # 12 rows: more than 8, so that the dispatch may sum split tiles by every block (cooperative).
    SEQS, HEADS, KV_HEADS, HEAD, INTER, BLOCK, GROUP = 12, 4, 2, 128, 768, 16, 128

    def __init__(self, device, dtype=torch.float16):
        self.device, self.dtype = device, dtype
        hidden, hs = self.HEADS * self.HEAD, self.HEAD
        self.hidden = hidden

        def layer(k, n):
            q = marlin.quantize_weights(torch.randn(k, n, device=device), "uint4b8", self.GROUP)
            packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), None, k, n)
            return packed, q["scales"].to(dtype)

        self.wqkv = layer(hidden, (self.HEADS + 2 * self.KV_HEADS) * hs)
        self.wo = layer(hidden, hidden)
        self.wgu = layer(hidden, 2 * self.INTER)
        self.wd = layer(self.INTER, hidden)
        self.ln_in = torch.rand(hidden, dtype=dtype, device=device) + 0.5
        self.ln_post = torch.rand(hidden, dtype=dtype, device=device) + 0.5
        self.cos_sin = torch.randn(4096, hs, dtype=dtype, device=device).clamp(-1, 1)
        self.workspace = marlin.make_workspace(device)
        # Lengths from 1 to past two 512-token partitions, in shuffled blocks.
        lens = [1, 17, 511, 513, 1100, 3, 64, 700, 1024, 255, 97, 1025]
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        self.max_len = max(lens)  # a host int: no sync inside a graph's capture
        per_seq = -(-self.max_len // self.BLOCK)
        blocks = self.SEQS * per_seq + 3
        self.block_tables = (
            torch.randperm(blocks, device=device)[: self.SEQS * per_seq].view(self.SEQS, -1).int()
        )
        last = (self.seq_lens - 1).long()
        self.slots = (
            self.block_tables[torch.arange(self.SEQS, device=device), last // self.BLOCK].long()
            * self.BLOCK
            + last % self.BLOCK
        )
        x = 16 // torch.empty((), dtype=dtype).element_size()
        kv = self.KV_HEADS
        self.key_cache = torch.randn(blocks, kv, hs // x, self.BLOCK, x, dtype=dtype, device=device)
        self.value_cache = torch.randn(blocks, kv, hs, self.BLOCK, dtype=dtype, device=device)
        self.one = torch.ones(1, dtype=torch.float32, device=device)

    def inputs(self):
        dev, dt = self.device, self.dtype
        return {
            "h": torch.randn(self.SEQS, self.hidden, dtype=dt, device=dev),
            "residual": torch.randn(self.SEQS, self.hidden, dtype=dt, device=dev),
            "positions": torch.randint(0, 4096, (self.SEQS,), device=dev),
        }

    def gemm(self, a, weights):
        return marlin.gptq_marlin_gemm(a, *weights, self.workspace)

    def run(self, h, residual, positions):
        ops, t, hs = torch.ops._C, self.SEQS, self.HEAD
        nh, nkv = self.HEADS, self.KV_HEADS
        x = torch.empty_like(h)
        ops.rms_norm(x, h, self.ln_in, 1e-5)
        qkv = self.gemm(x, self.wqkv)
        q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=1)  # strided views
        ops.rotary_embedding(positions, q, k, hs, self.cos_sin, True)
        ops.reshape_and_cache(
            k.view(t, nkv, hs), v.view(t, nkv, hs), self.key_cache, self.value_cache, self.slots,
            "auto", self.one, self.one,
        )  # fmt: skip
        attn = paged_attention(
            q.view(t, nh, hs), self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
            self.max_len, 1 / math.sqrt(hs), k_scale=self.one, v_scale=self.one,
            version="v2",
        ).view(t, nh * hs)  # fmt: skip
        o = self.gemm(attn, self.wo)
        ops.fused_add_rms_norm(o, residual, self.ln_post, 1e-5)
        gate_up = self.gemm(o, self.wgu)
        act = torch.empty(t, self.INTER, dtype=self.dtype, device=self.device)
        ops.silu_and_mul(act, gate_up)
        out = self.gemm(act, self.wd)
        return [qkv, attn, o, residual, act, out, self.key_cache, self.value_cache]


# name: (chain, APHRODITE_MARLIN_CONFIG or None for the dispatch's own plan)
CASES = {
    "pointwise": (Pointwise, None),
    "decode_layer": (DecodeLayer, None),
    "decode_layer-cluster": (DecodeLayer, "m16n256:4/cluster"),
    "decode_layer-spread": (DecodeLayer, "m16n256:4/spread"),
    "decode_layer-last": (DecodeLayer, "m16n256:4/last"),
}


def _skip_unless_built(name):
    statuses = map(aphrodite_ext.family_status, CASES[name][0].families)
    missing = [why for built, why in statuses if not built]
    if missing:
        pytest.skip("; ".join(missing))
    aphrodite_ext.load("_C")
    if "moe_sum" in CASES[name][0].families:
        aphrodite_ext.load("_moe_C")


def capture(chain, static):
    """A CUDA graph of chain.run(**static), and its outputs; warmed up off the default stream
    first, as capture wants."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain.run(**{k: v.clone() for k, v in static.items()})
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain.run(**static)
    return graph, outs


def _eager(chain, inputs):
    """The chain's results on its own copy of `inputs`, cloned; skips what a narrowed build left
    out."""
    with skip_left_out():
        return [r.clone() for r in chain.run(**{k: v.clone() for k, v in inputs.items()})]


@pytest.fixture(autouse=True)
def _cuda_only(device):
    if device != "cuda":
        pytest.skip("programmatic dependent launch is a CUDA launch")


def _setup(device, name, monkeypatch):
    """The case's chain, built and checked to run here (skips what the build left out)."""
    _skip_unless_built(name)
    cls, config = CASES[name]
    if config is not None:
        if "cluster" in config and torch.cuda.get_device_capability() < (9, 0):
            pytest.skip("thread block clusters are sm_90+")
        monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", config)
    chain = cls(device)
    _eager(chain, chain.inputs())
    return chain


@pytest.mark.parametrize("name", list(CASES))
def test_graph_replay_matches_eager(device, name, monkeypatch):
    chain = _setup(device, name, monkeypatch)
    static = chain.inputs()
    graph, outs = capture(chain, static)
    for _ in range(5):
        fresh = chain.inputs()
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        got = [o.clone() for o in outs]
        want = _eager(chain, fresh)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(g, w), f"{name}: result {i} differs between replay and eager"


# The chain replayed from a graph (back to back on the GPU, where PDL overlaps the kernels) on
# three sets of fresh inputs, in a process of its own; prints a digest of the results.
_SCRIPT = """
import sys, hashlib, torch
sys.path.insert(0, {tests!r})
import test_launch as t
torch.manual_seed({seed})
t._skip_unless_built({name!r})  # loads the modules
chain = t.CASES[{name!r}][0]("cuda")
static = chain.inputs()
graph, outs = t.capture(chain, static)
digest = hashlib.sha256()
for _ in range(3):
    for key, value in chain.inputs().items():
        static[key].copy_(value)
    graph.replay()
    for r in outs:
        digest.update(r.cpu().contiguous().view(torch.uint8).numpy().tobytes())
print(digest.hexdigest())
"""


@pytest.mark.parametrize("name", list(CASES))
def test_plain_launches_give_the_same_results(device, name, monkeypatch):
    _setup(device, name, monkeypatch)  # skips a left-out combination
    seed = torch.randint(0, 2**31, ()).item()
    script = _SCRIPT.format(tests=os.path.dirname(__file__), seed=seed, name=name)
    digests = []
    for pdl in ("0", "1"):
        env = {**os.environ, "APHRODITE_PDL": pdl}  # with the case's APHRODITE_MARLIN_CONFIG
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr
        digests.append(proc.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1], f"{name}: APHRODITE_PDL=0 and 1 differ (seed {seed})"
