"""Our CPU paged_attention_v1 against torch SDPA on the CPU, SDPA reading the same keys and
values laid out contiguously ([batch, kv_heads, context, head_size], GQA through enable_gqa).
Decode: one query token per sequence, batch 4, 32 query / 8 kv heads, head size 128, block
size 16. The outputs are checked to agree before anything is timed.

    python benchmarks/bench_paged_attention_cpu.py [--contexts 512 2048] [--out DIR]
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

BATCH, HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 32, 8, 128, 16
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_case(context: int, dtype: torch.dtype):
    """Contiguous K/V for SDPA and the same values in a paged cache (blocks shuffled)."""
    k = torch.randn(BATCH, KV_HEADS, context, HEAD_SIZE).to(dtype)
    v = torch.randn(BATCH, KV_HEADS, context, HEAD_SIZE).to(dtype)
    q = torch.randn(BATCH, HEADS, 1, HEAD_SIZE).to(dtype)
    x = 16 // k.element_size()
    blocks_per_seq = (context + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = BATCH * blocks_per_seq
    tables = torch.randperm(num_blocks).int().reshape(BATCH, blocks_per_seq)
    key_cache = torch.zeros(num_blocks, KV_HEADS, HEAD_SIZE // x, BLOCK_SIZE, x, dtype=dtype)
    value_cache = torch.zeros(num_blocks, KV_HEADS, HEAD_SIZE, BLOCK_SIZE, dtype=dtype)
    for s in range(BATCH):
        for j in range(blocks_per_seq):
            t = slice(j * BLOCK_SIZE, min(context, (j + 1) * BLOCK_SIZE))
            n = t.stop - t.start
            blk = int(tables[s, j])
            kb = k[s, :, t].reshape(KV_HEADS, n, HEAD_SIZE // x, x).permute(0, 2, 1, 3)
            key_cache[blk, :, :, :n] = kb
            value_cache[blk, :, :, :n] = v[s, :, t].transpose(1, 2)
    seq_lens = torch.full((BATCH,), context, dtype=torch.int32)
    return q, k, v, key_cache, value_cache, tables, seq_lens


def bench(dtype_name: str, context: int, reps: int) -> list:
    """One row: our kernel and SDPA on the same keys and values, after checking they agree."""
    dtype = getattr(torch, dtype_name)
    q, k, v, key_cache, value_cache, tables, seq_lens = make_case(context, dtype)
    out = torch.empty(BATCH, HEADS, HEAD_SIZE, dtype=dtype)
    q3, one, scale = q[:, :, 0], torch.ones(1), HEAD_SIZE**-0.5

    def ours():
        torch.ops._C.paged_attention_v1(
            out, q3, key_cache, value_cache, KV_HEADS, scale, tables, seq_lens, BLOCK_SIZE,
            context, None, "auto", one, one,
        )  # fmt: skip

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    ours()
    err = (out.float() - sdpa()[:, :, 0].float()).abs().max().item()
    if err > TOL[dtype]:
        raise SystemExit(f"{dtype_name} context {context}: outputs differ by {err}")
    t_ours = harness.median_ms(ours, "cpu", reps=reps)
    t_sdpa = harness.median_ms(sdpa, "cpu", reps=reps)
    kv_bytes = 2 * k.numel() * k.element_size()
    return [
        dtype_name,
        context,
        f"{t_ours * 1e3:.0f}",
        f"{t_sdpa * 1e3:.0f}",
        f"{kv_bytes / t_ours / 1e6:.1f}",
        f"{t_sdpa / t_ours:.2f}x",
        f"{err:.1e}",
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", type=int, nargs="*", default=[512, 2048])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    aphrodite_ext.load("_C")
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    rows = [bench(d, c, args.reps) for d in args.dtypes for c in args.contexts]
    header = ["dtype", "context", "ours us", "SDPA us", "ours GB/s (KV)", "speedup", "max |diff|"]
    notes = (
        f"decode, batch {BATCH}, {HEADS}/{KV_HEADS} heads, head size {HEAD_SIZE}, block size "
        f"{BLOCK_SIZE}; SDPA on contiguous K/V with enable_gqa=True; medians of {args.reps}; "
        f"1-minute load average before/after: {load_before:.1f}/{os.getloadavg()[0]:.1f}"
    )
    print(harness.write("paged_attention", "cpu", header, rows, args.out, notes))


if __name__ == "__main__":
    main()
