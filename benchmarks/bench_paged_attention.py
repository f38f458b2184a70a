"""Decode attention over a paged KV cache against torch SDPA on the same KV laid out
contiguously, in one run on one GPU. Reports time and KV bytes read per second (K and V of
every token of every sequence, once) for paged_attention_v1/v2 and for SDPA, and batch 1 with a
long context through v2 against the device's copy rate. Before timing, our outputs are checked
against SDPA's (bf16 tolerance), so that a fast wrong kernel cannot pass.

SDPA runs on [batch, kv_heads, ctx, head] K/V twice, and the faster counts as the peer:
with enable_gqa=True and a [batch, heads, 1, head] query, and with the query of each kv head's
group folded into the sequence dimension ([batch, kv_heads, group, head], no mask: the same
math, as an MHA problem with `group` query tokens). Neither copies the KV
(repeat_interleave would read it group times).

At small batches (1, 2, 4, 8, 12 and 16 sequences of 1024 and 4096 tokens), the
`paged_attention` wrapper with version="auto" (split_kv's choice of v1 or v2 and its partition
size) against the same SDPA, and v2 in 512-token partitions (vLLM's, the ops' default) beside
it.

The XL variant (xl_paged_attention_v1: score = scale * ((q + u) . k + matrix_bd[token])) is timed
at the same sizes against the same two SDPA forms given q + u as the query and scale *
matrix_bd as an additive attn_mask (the mask's bytes are not counted in KV TB/s).

    python benchmarks/bench_paged_attention.py [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import aphrodite_ext  # noqa: E402
from aphrodite_ext.ops.paged_attention import paged_attention, partition_for  # noqa: E402

HEADS, KV_HEADS, HEAD, BLOCK = 32, 8, 128, 16
PARTITION = 512
DTYPE = torch.bfloat16


def call(op, **named):
    """Calls torch.ops._C.<op> by argument name, so that the benchmark does not depend on the
    schema's argument order; arguments the schema has beyond ours take neutral values."""
    packet = getattr(torch.ops._C, op)
    neutral = {
        "tp_rank": 0,
        "blocksparse_local_blocks": 0,
        "blocksparse_vert_stride": 0,
        "blocksparse_block_size": 64,
        "blocksparse_head_sliding_step": 0,
    }
    args = []
    for a in packet.default._schema.arguments:
        if a.name in named:
            args.append(named[a.name])
        elif a.name in neutral:
            args.append(neutral[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            raise SystemExit(f"bench_paged_attention: {op} takes {a.name}, which it cannot fill")
    return packet(*args)


def paged(k, v, block, gen):
    """K/V [batch, kv_heads, ctx, head] as a paged cache with shuffled block tables."""
    b, kvh, ctx, d = k.shape
    x = 16 // k.element_size()
    nblk = math.ceil(ctx / block)
    pad = nblk * block - ctx
    if pad:
        k = F.pad(k, (0, 0, 0, pad))
        v = F.pad(v, (0, 0, 0, pad))
    total = b * nblk + 7  # a few blocks that no sequence uses
    perm = torch.randperm(total, generator=gen).to(k.device)[: b * nblk]
    kb = k.view(b, kvh, nblk, block, d // x, x).permute(0, 2, 1, 4, 3, 5)
    vb = v.view(b, kvh, nblk, block, d).permute(0, 2, 1, 4, 3)
    key_cache = torch.empty(total, kvh, d // x, block, x, dtype=k.dtype, device=k.device)
    value_cache = torch.empty(total, kvh, d, block, dtype=k.dtype, device=k.device)
    key_cache[perm] = kb.reshape(b * nblk, kvh, d // x, block, x)
    value_cache[perm] = vb.reshape(b * nblk, kvh, d, block)
    return key_cache, value_cache, perm.view(b, nblk).to(torch.int32)


class Problem:
    def __init__(self, batch, ctx, gen, device="cuda"):
        self.batch, self.ctx = batch, ctx
        self.q = torch.randn(batch, HEADS, HEAD, dtype=DTYPE, device=device)
        self.k = torch.randn(batch, KV_HEADS, ctx, HEAD, dtype=DTYPE, device=device)
        self.v = torch.randn(batch, KV_HEADS, ctx, HEAD, dtype=DTYPE, device=device)
        self.key_cache, self.value_cache, self.tables = paged(self.k, self.v, BLOCK, gen)
        self.seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        self.scale = HEAD**-0.5
        self.out = torch.empty_like(self.q)
        parts = math.ceil(ctx / PARTITION)
        self.exp_sums = torch.empty(batch, HEADS, parts, dtype=torch.float32, device=device)
        self.max_logits = torch.empty_like(self.exp_sums)
        self.tmp_out = torch.empty(batch, HEADS, parts, HEAD, dtype=torch.float32, device=device)
        self.one = torch.ones((), dtype=torch.float32, device=device)
        self.kv_bytes = 2 * self.k.numel() * self.k.element_size()

    def common(self):
        return dict(
            out=self.out,
            query=self.q,
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            num_kv_heads=KV_HEADS,
            scale=self.scale,
            block_tables=self.tables,
            seq_lens=self.seq_lens,
            block_size=BLOCK,
            max_seq_len=self.ctx,
            alibi_slopes=None,
            kv_cache_dtype="auto",
            k_scale=self.one,
            v_scale=self.one,
        )

    def v1(self):
        call("paged_attention_v1", **self.common())

    def v2(self):
        call(
            "paged_attention_v2",
            exp_sums=self.exp_sums,
            max_logits=self.max_logits,
            tmp_out=self.tmp_out,
            **self.common(),
        )

    def xl_inputs(self, gen):
        shape = (self.batch, HEADS, HEAD)
        self.u = torch.randn(shape, generator=gen).to(self.q.device, DTYPE)
        self.bd = torch.randn(self.batch, HEADS, self.ctx, generator=gen).to(self.q.device, DTYPE)
        self.qu = self.q + self.u  # the peer's query (the kernel adds u itself)
        self.mask = (self.bd.float() * self.scale).to(DTYPE)

    def xl_v1(self):
        named = self.common()
        del named["alibi_slopes"]
        call("xl_paged_attention_v1", pos_bias_u=self.u, matrix_bd=self.bd, **named)

    def xl_sdpa_gqa(self):
        return F.scaled_dot_product_attention(
            self.qu[:, :, None],
            self.k,
            self.v,
            attn_mask=self.mask[:, :, None],
            scale=self.scale,
            enable_gqa=True,
        )[:, :, 0]

    def xl_sdpa_grouped(self):
        g = HEADS // KV_HEADS
        q = self.qu.view(self.batch, KV_HEADS, g, HEAD)
        mask = self.mask.view(self.batch, KV_HEADS, g, self.ctx)
        o = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask, scale=self.scale)
        return o.reshape(self.batch, HEADS, HEAD)

    def sdpa_gqa(self):
        return F.scaled_dot_product_attention(
            self.q[:, :, None], self.k, self.v, scale=self.scale, enable_gqa=True
        )[:, :, 0]

    def sdpa_grouped(self):
        q = self.q.view(self.batch, KV_HEADS, HEADS // KV_HEADS, HEAD)
        o = F.scaled_dot_product_attention(q, self.k, self.v, scale=self.scale)
        return o.reshape(self.batch, HEADS, HEAD)


def check(name, ours, ref):
    """bf16 agreement relative to the output's scale: long contexts average many values, so
    outputs shrink, and a plain absolute tolerance would let zeros pass."""
    ours, ref = ours.float(), ref.float()
    if not torch.isfinite(ours).all():
        raise SystemExit(f"{name}: non-finite outputs")
    err = (ours - ref).abs().max().item()
    bound = 2e-2 * ref.abs().max().item() + 1e-4
    if err > bound:
        raise SystemExit(f"{name} disagrees with SDPA: max error {err:.3g} > {bound:.3g}")


def copy_tbs() -> float:
    src = torch.empty(2**28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = harness.median_ms(lambda: dst.copy_(src), "cuda", reps=50)
    return 2 * src.numel() * 4 / ms / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="contexts 1024 and 4096 only")
    args = parser.parse_args()
    aphrodite_ext.load("_C")
    gen = torch.Generator().manual_seed(0)
    header = ["batch", "ctx", "kernel", "ms", "KV TB/s", "vs SDPA"]
    rows = []
    contexts = (1024, 4096) if args.quick else (1024, 4096, 16384)

    def add_rows(pb, times, peer):
        for name, ms in times.items():
            tbs = f"{pb.kv_bytes / ms / 1e9:.2f}"
            rows.append([pb.batch, pb.ctx, name, f"{ms:.4f}", tbs, f"{peer / ms:.2f}"])

    for ctx in contexts:
        pb = Problem(32, ctx, gen)
        ref = pb.sdpa_grouped()
        check("sdpa enable_gqa", pb.sdpa_gqa(), ref)
        for name, fn in (("v1", pb.v1), ("v2", pb.v2)):
            pb.out.fill_(float("nan"))
            fn()
            check(f"paged_attention_{name} (batch 32, ctx {ctx})", pb.out, ref)
        times = {
            "sdpa enable_gqa": harness.median_ms(pb.sdpa_gqa, "cuda"),
            "sdpa grouped": harness.median_ms(pb.sdpa_grouped, "cuda"),
            "paged_attention_v1": harness.median_ms(pb.v1, "cuda"),
            "paged_attention_v2": harness.median_ms(pb.v2, "cuda"),
        }
        peer = min(times["sdpa enable_gqa"], times["sdpa grouped"])
        add_rows(pb, times, peer)
        pb.xl_inputs(gen)
        ref = pb.xl_sdpa_grouped()
        peers = {"xl sdpa grouped + mask": pb.xl_sdpa_grouped}
        try:  # GQA with a mask is not every SDPA backend's
            check("xl sdpa enable_gqa", pb.xl_sdpa_gqa(), ref)
            peers["xl sdpa enable_gqa + mask"] = pb.xl_sdpa_gqa
        except RuntimeError as e:
            print(f"xl sdpa enable_gqa + mask left out: {str(e).splitlines()[0]}")
        pb.out.fill_(float("nan"))
        pb.xl_v1()
        check(f"xl_paged_attention_v1 (batch 32, ctx {ctx})", pb.out, ref)
        times = {name: harness.median_ms(fn, "cuda") for name, fn in peers.items()}
        peer = min(times.values())
        times["xl_paged_attention_v1"] = harness.median_ms(pb.xl_v1, "cuda")
        add_rows(pb, times, peer)
        del pb
        torch.cuda.empty_cache()

    for ctx in (1024, 4096):
        for batch in (1, 2, 4, 8, 12, 16):
            pb = Problem(batch, ctx, gen)
            ref = pb.sdpa_grouped()
            size = partition_for(pb.q, pb.key_cache, pb.value_cache, ctx)
            auto_name = f"auto: v2 in {size}-token partitions" if size else "auto: v1"

            def auto(pb=pb):
                paged_attention(
                    pb.q, pb.key_cache, pb.value_cache, pb.tables, pb.seq_lens, pb.ctx, pb.scale,
                    k_scale=pb.one, v_scale=pb.one, out=pb.out,
                )  # fmt: skip

            for name, fn in ((auto_name, auto), ("v2 in 512-token partitions", pb.v2)):
                pb.out.fill_(float("nan"))
                fn()
                check(f"{name} (batch {batch}, ctx {ctx})", pb.out, ref)
            times = {
                "sdpa enable_gqa": harness.median_ms(pb.sdpa_gqa, "cuda"),
                "sdpa grouped": harness.median_ms(pb.sdpa_grouped, "cuda"),
                auto_name: harness.median_ms(auto, "cuda"),
                "v2 in 512-token partitions": harness.median_ms(pb.v2, "cuda"),
            }
            add_rows(pb, times, min(times["sdpa enable_gqa"], times["sdpa grouped"]))
            del pb
            torch.cuda.empty_cache()

    copy = copy_tbs()
    pb = Problem(1, 65536, gen)
    pb.out.fill_(float("nan"))
    pb.v2()
    check("paged_attention_v2 (batch 1, ctx 65536)", pb.out, pb.sdpa_grouped())
    ms = harness.median_ms(pb.v2, "cuda")
    tbs = pb.kv_bytes / ms / 1e9
    rows.append(
        [
            1,
            65536,
            "paged_attention_v2",
            f"{ms:.4f}",
            f"{tbs:.2f}",
            f"{tbs / copy:.2f} of copy ({copy:.2f} TB/s)",
        ]
    )
    notes = (
        f"bf16, {HEADS} query heads / {KV_HEADS} kv heads, head {HEAD}, block {BLOCK}, "
        f"v2 partitions of {PARTITION} tokens but the 'auto' rows' (split_kv); KV TB/s = K "
        "and V bytes of every token once / time; 'vs SDPA' = the faster SDPA's time / this "
        "time (SDPA rows: vs the faster of the two); copy rate = bytes read + written / time. XL rows: "
        "xl_paged_attention_v1 against SDPA given q + u and scale * matrix_bd as an "
        "additive mask, 'vs SDPA' against the faster of those two."
    )
    print(harness.write("paged_attention", "cuda", header, rows, out_dir=args.out, notes=notes))


if __name__ == "__main__":
    main()
