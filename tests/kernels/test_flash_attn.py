"""_fa2_C.varlen_fwd (FA2-style flash attention forward) against the fp32 reference.

Tolerances, |out - ref| <= atol + rtol * |ref| element-wise: the kernel rounds P to the input
dtype before P V (relative error 2^-9 bf16, 2^-12 fp16 per weight, so at most that fraction of
max |v| in the output) and rounds the fp32 output once (half an ulp: rtol). bf16: atol 1e-2,
rtol 1e-2; fp16: atol 2e-3, rtol 2e-3. The LSE comes from the same fp32 scores as the
reference's and is held to 1e-3 absolute (fp16) and 2e-3 (bf16)."""

from __future__ import annotations

import math
import random

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.flash_attn import flash_attn_varlen_func, flash_attn_varlen_ref

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}  # (atol, rtol)
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 2e-3}
DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 128]
# (num_heads, num_kv_heads): MHA, GQA 4, GQA 8.
GROUPS = [(4, 4), (8, 2), (8, 1)]
# One batch: a single token, lengths off every tile size, more than one 64-row tile.
SEQ_LENS_Q = [1, 7, 64, 83, 130, 200]


@pytest.fixture(autouse=True)
def _needs_fa2(device):
    if device != "cuda":
        pytest.skip("flash_attn is a CUDA-only family (module _fa2_C)")
    built, why = aphrodite_ext.module_status("_fa2_C")
    if not built:
        pytest.skip(why)
    aphrodite_ext.load("_fa2_C")


def make_batch(seq_q, seq_k, heads, kv_heads, head_dim, dtype, device, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    total_q, total_k = sum(seq_q), sum(seq_k)
    q = torch.randn(total_q, heads, head_dim, generator=gen).to(device, dtype)
    k = torch.randn(total_k, kv_heads, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(total_k, kv_heads, head_dim, generator=gen).to(device, dtype)
    cu_q = torch.tensor([0, *torch.tensor(seq_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(seq_k).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_q.to(device), cu_k.to(device)


def check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, out=None):
    scale = 1.0 / math.sqrt(q.shape[-1])
    got, lse = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(seq_q), max(seq_k), scale, causal, True, out=out
    )
    ref, ref_lse = flash_attn_varlen_ref(q, k, v, cu_q, cu_k, scale, causal)
    assert got.shape == q.shape and got.dtype == dtype
    assert torch.isfinite(got).all()
    atol, rtol = TOL[dtype]
    diff = (got.float() - ref).abs()
    excess = (diff - rtol * ref.abs()).max().item()
    assert excess <= atol, f"max |out - ref| = {diff.max().item()}, beyond rtol*|ref| by {excess}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), "LSE -inf rows differ"
    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err <= LSE_TOL[dtype], f"max |lse - ref| = {lse_err}"
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads, kv_heads", GROUPS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_reference(device, dtype, head_dim, heads, kv_heads, causal):
    rng = random.Random(head_dim * 7 + heads + causal)
    seq_q = list(SEQ_LENS_Q)
    rng.shuffle(seq_q)
    # Keys at least as long as queries (the usual prefill with a cached prefix), some equal.
    seq_k = [s + rng.choice([0, 0, 1, 37, 150]) for s in seq_q]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, heads, kv_heads, head_dim, dtype, device)
    check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [96, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_other_head_dims(device, dtype, head_dim, causal):
    seq_q = [1, 70, 129]
    seq_k = [1, 75, 193]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 2, head_dim, dtype, device, seed=head_dim)
    check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_queries_longer_than_keys_causal(device, dtype):
    # Bottom-right alignment: the first sq - sk query rows see no key (zeros, LSE -inf).
    seq_q, seq_k = [100, 9], [40, 9]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 2, 64, dtype, device, seed=3)
    got = check(q, k, v, cu_q, cu_k, seq_q, seq_k, True, dtype)
    assert (got[:60] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_inputs_and_out(device, dtype):
    # q, k, v as head slices of a fused qkv buffer; out provided (poisoned) and written in place.
    seq = [33, 70, 1]
    heads, kv_heads, d = 8, 2, 128
    total = sum(seq)
    qkv = torch.randn(total, heads + 2 * kv_heads, d, device=device, dtype=dtype)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    cu = torch.tensor([0, 33, 103, 104], dtype=torch.int32, device=device)
    out = torch.full((total, heads, d), float("nan"), device=device, dtype=dtype)
    got = check(q, k, v, cu, cu, seq, seq, True, dtype, out=out)
    assert got.data_ptr() == out.data_ptr()


def test_long_sequence(device):
    # Many key tiles with the online-softmax rescaling; large-magnitude scores.
    seq = [1500]
    q, k, v, cu_q, cu_k = make_batch(seq, seq, 2, 2, 128, torch.bfloat16, device, seed=5)
    check(q * 3, k, v, cu_q, cu_k, seq, seq, False, torch.bfloat16)
    check(q, k, v, cu_q, cu_k, seq, seq, True, torch.bfloat16)


def test_opcheck(device):
    seq_q, seq_k = [5, 70], [9, 70]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 2, 64, torch.float16, device)
    args = (q, k, v, None, cu_q, cu_k, 70, 70, 0.125, True, True)
    torch.library.opcheck(torch.ops._fa2_C.varlen_fwd.default, args)
    out = torch.empty_like(q)
    args = (q, k, v, out, cu_q, cu_k, 70, 70, 0.125, False, False)
    torch.library.opcheck(torch.ops._fa2_C.varlen_fwd.default, args)


def test_torch_compile(device):
    seq = [17, 40]
    q, k, v, cu_q, cu_k = make_batch(seq, seq, 4, 4, 64, torch.bfloat16, device)

    def fn(q, k, v):
        out, lse = torch.ops._fa2_C.varlen_fwd(q, k, v, None, cu_q, cu_k, 40, 40, 0.125, True, True)
        return out * 2, lse

    eager = fn(q, k, v)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(compiled, eager)


def test_bad_inputs(device):
    seq = [8, 8]
    q, k, v, cu_q, cu_k = make_batch(seq, seq, 4, 4, 64, torch.float16, device)
    f = flash_attn_varlen_func
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        f(q.float(), k.float(), v.float(), cu_q, cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="k must be Half, got BFloat16"):
        f(q, k.bfloat16(), v, cu_q, cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="is not in this build"):
        qq, kk, vv, _, _ = make_batch(seq, seq, 4, 4, 40, torch.float16, device)
        f(qq, kk, vv, cu_q, cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        f(q.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :64], k, v, cu_q, cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must be int32"):
        f(q, k, v, cu_q.long(), cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="cu_seqlens_k is on cpu"):
        f(q, k, v, cu_q, cu_k.cpu(), 8, 8)
    with pytest.raises(RuntimeError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        kk = torch.randn(16, 3, 64, device=device, dtype=torch.float16)
        f(q, kk, kk, cu_q, cu_k, 8, 8)
    with pytest.raises(RuntimeError, match="softmax_scale must be a finite number > 0"):
        f(q, k, v, cu_q, cu_k, 8, 8, softmax_scale=-1.0)
    with pytest.raises(RuntimeError, match="v must have the shape of k"):
        f(q, k, v[:8], cu_q, cu_k, 8, 8)
