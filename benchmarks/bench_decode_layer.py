"""One decode step of a Llama-style layer on our kernels, replayed from a CUDA graph, with
programmatic dependent launch (PDL) off and on (APHRODITE_PDL=0 / 1, each in its own process,
rounds alternating): what launches that overlap the previous kernel's end add up to over the ten
kernels of a layer (eleven where paged attention runs v2, which adds its reduce), and, pair by
pair, what two neighbouring kernels of it take replayed in turn (each pair has two such
boundaries: the second kernel after the first, the first after the second).

The layer (fp16; hidden 4096, 32 query and 8 KV heads of 128, intermediate 14336; 4-bit weights
in groups of 128; a paged KV cache of 16-token blocks, every sequence `CONTEXT` tokens):
rms_norm, marlin qkv, rotary, reshape_and_cache, paged attention (v1, or v2 where split_kv
splits: batch 1 to 8 here), marlin o, fused_add_rms_norm, marlin gate/up, silu_and_mul, marlin
down. The weights are random bits (the GEMM's time does not depend on them).

    python benchmarks/bench_decode_layer.py [--out DIR] [--rounds N] [--batches B ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import aphrodite_ext  # noqa: E402
from aphrodite_ext.ops import marlin  # noqa: E402
from aphrodite_ext.ops.paged_attention import paged_attention  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD, INTER, BLOCK, GROUP = 4096, 32, 8, 128, 14336, 16, 128
CONTEXT = 1024
BATCHES = (1, 16, 64)
FAMILIES = ("activation", "layernorm", "rotary", "cache", "paged_attention", "marlin")


class Layer:
    def __init__(self, batch: int, dtype=torch.float16, device="cuda"):
        self.batch, self.dtype, self.device = batch, dtype, device

        def weights(k, n):
            packed = torch.randint(-(2**31), 2**31 - 1, (k // 16, 2 * n), dtype=torch.int32)
            scales = torch.rand(k // GROUP, n, dtype=dtype) / (8 * k**0.5)
            return packed.to(device), scales.to(device)

        self.wqkv = weights(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD)
        self.wo = weights(HEADS * HEAD, HIDDEN)
        self.wgu = weights(HIDDEN, 2 * INTER)
        self.wd = weights(INTER, HIDDEN)
        self.workspace = marlin.make_workspace(device)
        self.ln = torch.rand(HIDDEN, dtype=dtype, device=device) + 0.5
        self.cos_sin = torch.randn(8192, HEAD, dtype=dtype, device=device).clamp(-1, 1)
        per_seq = CONTEXT // BLOCK
        blocks = batch * per_seq
        self.block_tables = torch.randperm(blocks, device=device).view(batch, per_seq).int()
        self.seq_lens = torch.full((batch,), CONTEXT, dtype=torch.int32, device=device)
        self.slots = self.block_tables[:, -1].long() * BLOCK + BLOCK - 1
        self.positions = torch.full((batch,), CONTEXT - 1, device=device)
        x = 16 // torch.empty((), dtype=dtype).element_size()
        self.key_cache = torch.randn(
            blocks, KV_HEADS, HEAD // x, BLOCK, x, dtype=dtype, device=device
        )
        self.value_cache = torch.randn(blocks, KV_HEADS, HEAD, BLOCK, dtype=dtype, device=device)
        self.one = torch.ones(1, dtype=torch.float32, device=device)
        # Every step's tensors, allocated once (the graph replays the kernels alone).
        e = lambda *shape: torch.empty(*shape, dtype=dtype, device=device)  # noqa: E731
        self.h, self.residual = e(batch, HIDDEN).normal_(), e(batch, HIDDEN).normal_()
        self.x = e(batch, HIDDEN)
        self.qkv = self.gemm(self.x, self.wqkv)
        self.attn, self.act = e(batch, HEADS * HEAD), e(batch, INTER)
        self.o = self.gemm(self.attn, self.wo)
        self.gate_up = self.gemm(self.o, self.wgu)

    def gemm(self, a, weights):
        return marlin.gptq_marlin_gemm(a, *weights, self.workspace)

    # The layer's kernels, one callable each.
    def norm_in(self):
        torch.ops._C.rms_norm(self.x, self.h, self.ln, 1e-5)

    def qkv_proj(self):
        self.qkv = self.gemm(self.x, self.wqkv)

    def rotary(self):
        q, k, _ = self.qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=1)
        torch.ops._C.rotary_embedding(self.positions, q, k, HEAD, self.cos_sin, True)

    def cache(self):
        b = self.batch
        _, k, v = self.qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=1)
        torch.ops._C.reshape_and_cache(
            k.view(b, KV_HEADS, HEAD), v.view(b, KV_HEADS, HEAD), self.key_cache,
            self.value_cache, self.slots, "auto", self.one, self.one,
        )  # fmt: skip

    def attention(self):
        q = self.qkv[:, : HEADS * HEAD].view(self.batch, HEADS, HEAD)
        paged_attention(
            q, self.key_cache, self.value_cache, self.block_tables, self.seq_lens, CONTEXT,
            HEAD**-0.5, k_scale=self.one, v_scale=self.one,
            out=self.attn.view(self.batch, HEADS, HEAD),
        )  # fmt: skip

    def o_proj(self):
        self.o = self.gemm(self.attn, self.wo)

    def norm_post(self):
        torch.ops._C.fused_add_rms_norm(self.o, self.residual, self.ln, 1e-5)

    def gate_up_proj(self):
        self.gate_up = self.gemm(self.o, self.wgu)

    def silu(self):
        torch.ops._C.silu_and_mul(self.act, self.gate_up)

    def down_proj(self):
        self.h = self.gemm(self.act, self.wd)

    def step(self):
        for kernel in self.kernels():
            kernel()

    def kernels(self):
        return [
            self.norm_in, self.qkv_proj, self.rotary, self.cache, self.attention, self.o_proj,
            self.norm_post, self.gate_up_proj, self.silu, self.down_proj,
        ]  # fmt: skip


# (label, first kernel, second kernel or None: the first after itself)
PAIRS = [
    ("paged attention", "attention", None),
    ("rms_norm, marlin qkv", "norm_in", "qkv_proj"),
    ("marlin qkv, rotary", "qkv_proj", "rotary"),
    ("rotary, reshape_and_cache", "rotary", "cache"),
    ("reshape_and_cache, paged attention", "cache", "attention"),
    ("paged attention, marlin o", "attention", "o_proj"),
    ("marlin o, fused_add_rms_norm", "o_proj", "norm_post"),
    ("marlin gate/up, silu_and_mul", "gate_up_proj", "silu"),
]


def worker(batches: list[int]) -> None:
    """Times every case under this process's APHRODITE_PDL; prints them as JSON."""
    out = {}
    for batch in batches:
        layer = Layer(batch)
        ms = harness.graph_ms(layer.step, calls=10, reps=30)
        out[f"layer step|{batch}"] = None if ms is None else ms * 1e3
        for label, first, second in PAIRS:
            a = getattr(layer, first)
            b = getattr(layer, second) if second else None
            ms = harness.graph_ms(lambda a=a, b=b: (a(), b and b()), calls=25)
            out[f"{label}|{batch}"] = None if ms is None else ms * 1e3
        del layer
        torch.cuda.empty_cache()
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(b < 1 for b in args.batches):
        raise SystemExit(f"bench_decode_layer: --batches must be positive, got {args.batches}")
    if not torch.cuda.is_available():
        raise SystemExit("bench_decode_layer: needs a CUDA GPU")
    missing = [why for built, why in map(aphrodite_ext.family_status, FAMILIES) if not built]
    if missing:
        raise SystemExit("bench_decode_layer: " + "; ".join(missing))
    aphrodite_ext.load("_C")
    if args.worker:
        worker(args.batches)
        return
    runs: dict[str, list[dict]] = {"0": [], "1": []}
    for _ in range(args.rounds):
        for pdl in runs:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", "--batches", *map(str, args.batches)],
                capture_output=True,
                text=True,
                env={**os.environ, "APHRODITE_PDL": pdl},
            )
            if proc.returncode != 0:
                raise SystemExit(f"bench_decode_layer: worker failed:\n{proc.stderr[-3000:]}")
            runs[pdl].append(json.loads(proc.stdout.strip().splitlines()[-1]))

    def cell(pdl, key):
        values = [r[key] for r in runs[pdl] if r.get(key) is not None]
        if not values:
            return "-", None
        mid = statistics.median(values)
        return f"{mid:.2f} ({min(values):.2f}-{max(values):.2f})", mid

    rows = []
    for key in runs["0"][0]:
        what, batch = key.split("|")
        off, off_mid = cell("0", key)
        on, on_mid = cell("1", key)
        saved = "-" if off_mid is None or on_mid is None else f"{off_mid - on_mid:+.2f}"
        rows.append([what, batch, off, on, saved])
    header = ["case", "batch", "PDL off us", "PDL on us", "off - on us"]
    notes = (
        "Per call, us: `layer step` is the ten kernels (eleven where attention runs v2: its "
        f"reduce) of one decode layer (fp16, hidden {HIDDEN}, "
        f"{HEADS} / {KV_HEADS} heads of {HEAD}, intermediate {INTER}, W4A16 group {GROUP}, context "
        f"{CONTEXT}), 10 steps replayed from one CUDA graph; a pair `X, Y` is X then Y, 25 times "
        "over from one graph, per pair (`paged attention` alone: itself 25 times, per call). "
        f"Median of {args.rounds} rounds (range), the rounds alternating APHRODITE_PDL=0 and 1, "
        "each in its own process."
    )
    print(harness.write("decode_layer", "cuda", header, rows, out_dir=args.out, notes=notes))


if __name__ == "__main__":
    main()
