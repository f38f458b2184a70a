"""End to end: a small Llama-style model (a few decoder layers, random weights) runs a prefill
and then decode steps with our kernels and a paged KV cache, and must match the same model in
plain fp32 torch with dense causal attention over the whole sequence.

Ours per layer: rms_norm / fused_add_rms_norm, rotary_embedding in place on slices of the fused
qkv projection, reshape_and_cache into the paged cache, paged attention for decode steps (torch's
SDPA for the prefill attention: our prefill kernel lives in the flash-attention module),
silu_and_mul. Projections are torch matmuls in both paths."""

from __future__ import annotations

import math

import pytest
import torch
from narrowed import skip_left_out

import aphrodite_ext

# Norm-wise relative error of the final hidden states against the fp32 reference.
TOL = {torch.float32: 2e-5, torch.bfloat16: 4e-2}
BLOCK_SIZE = 16


# The families the model runs on; a build narrowed by APHRODITE_DISABLE_FAMILIES may leave one out.
FAMILIES = ("activation", "layernorm", "rotary", "cache", "paged_attention")


@pytest.fixture(autouse=True)
def _load(device):
    missing = [why for built, why in map(aphrodite_ext.family_status, FAMILIES) if not built]
    if missing:
        pytest.skip("; ".join(missing))
    aphrodite_ext.load("_C")


class Model:
    """Weights and shapes of a tiny Llama: GQA attention with rotary embeddings, SwiGLU MLP."""

    def __init__(self, device, layers=2, hidden=512, heads=8, kv_heads=2, inter=1408, rope=1024):
        self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
        self.head_size = hidden // heads
        self.inter = inter

        def lin(out_f, in_f):
            return torch.randn(out_f, in_f, device=device) / math.sqrt(in_f)

        qkv = (heads + 2 * kv_heads) * self.head_size
        self.layers = [
            dict(
                ln_in=1 + 0.1 * torch.randn(hidden, device=device),
                wqkv=lin(qkv, hidden),
                wo=lin(hidden, heads * self.head_size),
                ln_post=1 + 0.1 * torch.randn(hidden, device=device),
                wgu=lin(2 * inter, hidden),
                wd=lin(hidden, inter),
            )
            for _ in range(layers)
        ]
        self.ln_final = 1 + 0.1 * torch.randn(hidden, device=device)
        inv_freq = 1.0 / (
            10000 ** (torch.arange(0, self.head_size, 2, device=device) / self.head_size)
        )
        angles = torch.arange(rope, device=device).float()[:, None] * inv_freq[None, :]
        self.cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [rope, head_size]
        self.eps = 1e-5

    def cast(self, dtype):
        """A copy of the weights in dtype (the rotary cache stays fp32)."""
        other = object.__new__(Model)
        other.__dict__.update(self.__dict__)
        other.layers = [{k: v.to(dtype) for k, v in layer.items()} for layer in self.layers]
        other.ln_final = self.ln_final.to(dtype)
        return other


# ---------------------------------------------------------------- the plain fp32 reference ---
def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_neox(x, pos, cos_sin):
    half = x.shape[-1] // 2
    cos, sin = cos_sin[pos, :half][:, None, :], cos_sin[pos, half:][:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference(m: Model, tokens_h: torch.Tensor) -> torch.Tensor:
    """Hidden states after the final norm for one sequence's embeddings [L, hidden]."""
    L = tokens_h.shape[0]
    pos = torch.arange(L, device=tokens_h.device)
    h = tokens_h.float()
    hs, nh, nkv = m.head_size, m.heads, m.kv_heads
    for layer in m.layers:
        x = _rms(h, layer["ln_in"], m.eps)
        q, k, v = (x @ layer["wqkv"].T).split([nh * hs, nkv * hs, nkv * hs], dim=-1)
        q = _rope_neox(q.view(L, nh, hs), pos, m.cos_sin)
        k = _rope_neox(k.view(L, nkv, hs), pos, m.cos_sin)
        v = v.view(L, nkv, hs)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hs)
        scores = scores.masked_fill(torch.ones(L, L, device=h.device).triu(1).bool(), -torch.inf)
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(L, nh * hs)
        h = h + attn @ layer["wo"].T
        x = _rms(h, layer["ln_post"], m.eps)
        gate, up = (x @ layer["wgu"].T).split(m.inter, dim=-1)
        h = h + (torch.nn.functional.silu(gate) * up) @ layer["wd"].T
    return _rms(h, m.ln_final, m.eps)


# ------------------------------------------------------------------------- ours, paged ---
class PagedRunner:
    """Runs batches of sequences through the model with our kernels and one paged KV cache per
    layer; each sequence owns the blocks of its row of a shuffled block table."""

    def __init__(self, m: Model, dtype, num_seqs, max_len, device):
        self.m, self.dtype, self.device = m, dtype, device
        blocks_per_seq = -(-max_len // BLOCK_SIZE)
        num_blocks = num_seqs * blocks_per_seq + 3  # a few blocks nobody owns
        self.block_tables = (
            torch.randperm(num_blocks, device=device)[: num_seqs * blocks_per_seq]
            .view(num_seqs, blocks_per_seq)
            .int()
        )
        x = 16 // torch.empty((), dtype=dtype).element_size()
        hs = m.head_size
        self.caches = [
            (
                torch.randn(
                    num_blocks, m.kv_heads, hs // x, BLOCK_SIZE, x, dtype=dtype, device=device
                ),
                torch.randn(num_blocks, m.kv_heads, hs, BLOCK_SIZE, dtype=dtype, device=device),
            )
            for _ in m.layers
        ]
        self.one = torch.ones((), dtype=torch.float32, device=device)

    def slots(self, seq_ids, positions):
        blocks = self.block_tables[seq_ids, positions // BLOCK_SIZE].long()
        return blocks * BLOCK_SIZE + positions % BLOCK_SIZE

    def forward(self, h, seq_ids, positions, prefill_lens=None, seq_lens=None):
        """h [T, hidden] in dtype for the tokens (seq_ids[t], positions[t]); prefill when
        prefill_lens is given (tokens grouped by sequence), else one decode token per sequence."""
        from aphrodite_ext.ops.paged_attention import paged_attention

        m, ops = self.m, torch.ops._C
        hs, nh, nkv = m.head_size, m.heads, m.kv_heads
        T = h.shape[0]
        slot_mapping = self.slots(seq_ids, positions)
        h = h.clone()
        residual = None
        for layer, (key_cache, value_cache) in zip(m.layers, self.caches, strict=True):
            if residual is None:
                residual = h
                x = torch.empty_like(h)
                ops.rms_norm(x, h, layer["ln_in"], m.eps)
            else:
                x = h
                ops.fused_add_rms_norm(x, residual, layer["ln_in"], m.eps)
            qkv = x @ layer["wqkv"].T
            q = qkv[:, : nh * hs]  # strided views of the fused projection
            k = qkv[:, nh * hs : (nh + nkv) * hs]
            v = qkv[:, (nh + nkv) * hs :]
            ops.rotary_embedding(positions, q, k, hs, m.cos_sin.to(self.dtype), True)
            ops.reshape_and_cache(
                k.view(T, nkv, hs), v.view(T, nkv, hs), key_cache, value_cache, slot_mapping,
                "auto", self.one, self.one,
            )  # fmt: skip
            if prefill_lens is not None:
                outs = []
                for qs, ks, vs in zip(
                    q.split(prefill_lens), k.split(prefill_lens), v.split(prefill_lens), strict=True
                ):
                    L = qs.shape[0]
                    o = torch.nn.functional.scaled_dot_product_attention(
                        qs.reshape(L, nh, hs).transpose(0, 1),
                        ks.reshape(L, nkv, hs).transpose(0, 1).repeat_interleave(nh // nkv, 0),
                        vs.reshape(L, nkv, hs).transpose(0, 1).repeat_interleave(nh // nkv, 0),
                        is_causal=True,
                    )
                    outs.append(o.transpose(0, 1).reshape(L, nh * hs))
                attn = torch.cat(outs)
            else:
                attn = paged_attention(
                    q.view(T, nh, hs), key_cache, value_cache, self.block_tables[seq_ids],
                    seq_lens, int(seq_lens.max()), 1 / math.sqrt(hs),
                ).view(T, nh * hs)  # fmt: skip
            o = attn @ layer["wo"].T
            ops.fused_add_rms_norm(o, residual, layer["ln_post"], m.eps)
            gate_up = o @ layer["wgu"].T
            act = torch.empty(T, m.inter, dtype=self.dtype, device=self.device)
            ops.silu_and_mul(act, gate_up)
            h = act @ layer["wd"].T
        ops.fused_add_rms_norm(h, residual, m.ln_final, m.eps)
        return h


@pytest.mark.parametrize("dtype", list(TOL))
def test_prefill_then_decode(device, dtype):
    with skip_left_out():  # a paged-attention instantiation that generator options left out
        _prefill_then_decode(device, dtype)


def _prefill_then_decode(device, dtype):
    m32 = Model(device)
    m = m32.cast(dtype)
    prompt_lens = [7, 19, 33]
    decode_steps = 5
    runner = PagedRunner(m, dtype, len(prompt_lens), max(prompt_lens) + decode_steps, device)
    embeds = [torch.randn(n + decode_steps, m.hidden, device=device) for n in prompt_lens]

    # Prefill: every prompt token of every sequence in one batch.
    seq_ids = torch.cat([torch.full((n,), i, device=device) for i, n in enumerate(prompt_lens)])
    positions = torch.cat([torch.arange(n, device=device) for n in prompt_lens])
    h = torch.cat([e[:n] for e, n in zip(embeds, prompt_lens, strict=True)]).to(dtype)
    out = runner.forward(h, seq_ids.long(), positions.long(), prefill_lens=prompt_lens)
    ref = torch.cat([reference(m32, e[:n]) for e, n in zip(embeds, prompt_lens, strict=True)])
    _check(out, ref, dtype, "prefill")

    # Decode: one new token per sequence per step, attending over the paged cache.
    seq_ids = torch.arange(len(prompt_lens), device=device)
    for step in range(decode_steps):
        positions = torch.tensor(prompt_lens, device=device) + step
        h = torch.stack([e[p] for e, p in zip(embeds, positions.tolist(), strict=True)]).to(dtype)
        seq_lens = (positions + 1).int()
        out = runner.forward(h, seq_ids, positions.long(), seq_lens=seq_lens)
        ref = torch.stack(
            [
                reference(m32, e[: p + 1])[-1]
                for e, p in zip(embeds, positions.tolist(), strict=True)
            ]
        )
        _check(out, ref, dtype, f"decode step {step}")


def _check(out, ref, dtype, what):
    assert torch.isfinite(out).all(), f"{what}: non-finite outputs"
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < TOL[dtype], f"{what}: norm-wise relative error {err:.2e} >= {TOL[dtype]:.0e}"
