"""_fa2_C.varlen_fwd (FA2-style flash attention forward) against the fp32 reference: dense and
paged K/V, causal and sliding-window masks, logit softcap.

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
from narrowed import skip_left_out

import aphrodite_ext
from aphrodite_ext.ops.flash_attn import flash_attn_varlen_func, flash_attn_varlen_ref

TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}  # (atol, rtol)
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 2e-3}
DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 128]
# (num_heads, num_kv_heads): MHA, GQA 4, GQA 8.
GROUPS = [(4, 4), (8, 2), (8, 1)]
# One batch: a single token, lengths off every tile size, more than one 128-row tile.
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


def to_paged(k, v, cu_k, block_size, seed=0, spare=3):
    """k/v [total_k, kv_heads, d] -> caches [num_blocks, block_size, kv_heads, d] with every
    sequence's blocks scattered over a shuffled pool, and the block table; the table's entries
    past a sequence's last block hold an out-of-range index, which the kernel must not read."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cu = cu_k.tolist()
    lens = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    per_seq = [(s + block_size - 1) // block_size for s in lens]
    num_blocks = sum(per_seq) + spare
    shape = (num_blocks, block_size, k.shape[1], k.shape[2])
    # Unused cache rows hold NaN: a row read past a sequence's end would poison the output.
    k_cache = torch.full(shape, float("nan"), dtype=k.dtype, device=k.device)
    v_cache = torch.full(shape, float("nan"), dtype=v.dtype, device=v.device)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(lens), max(per_seq) + 2), 1 << 30, dtype=torch.int32)
    for b, n in enumerate(per_seq):
        blocks, pool = pool[:n], pool[n:]
        table[b, :n] = torch.tensor(blocks, dtype=torch.int32)
        for i, blk in enumerate(blocks):
            rows = min(block_size, lens[b] - i * block_size)
            src = slice(cu[b] + i * block_size, cu[b] + i * block_size + rows)
            k_cache[blk, :rows] = k[src]
            v_cache[blk, :rows] = v[src]
    return k_cache, v_cache, table.to(k.device)


def check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, out=None, paged=None, **features):
    """Runs the op (on the paged caches `paged` = (k_cache, v_cache, table) when given, else on
    k/v) and compares out and LSE with the reference on the dense k/v."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    kk, vv = (k, v) if paged is None else paged[:2]
    if paged is not None:
        features["block_table"] = paged[2]
    with skip_left_out():
        got, lse = flash_attn_varlen_func(
            q, kk, vv, cu_q, cu_k, max(seq_q), max(seq_k), scale, causal, True, out=out, **features
        )
    features.pop("block_table", None)
    ref, ref_lse = flash_attn_varlen_ref(q, k, v, cu_q, cu_k, scale, causal, **features)
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
@pytest.mark.parametrize("block_size", [None, 16, 128])  # None: dense K/V
def test_other_head_dims(device, dtype, head_dim, causal, block_size):
    # More than one 128-row query tile (96 runs 128-row tiles), a full one and a partial one; a
    # paged cache of 16-row blocks (K/V tiles gathered in row groups) and of 128 (each tile in one
    # block).
    seq_q = [1, 70, 129, 300]
    seq_k = [1, 75, 193, 310]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 2, head_dim, dtype, device, seed=head_dim)
    pages = None if block_size is None else to_paged(k, v, cu_k, block_size, seed=head_dim)
    check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, paged=pages)


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
    op = torch.ops._fa2_C.varlen_fwd.default
    args = (q, k, v, None, cu_q, cu_k, None, None, 70, 70, 0.125, True, -1, -1, 0.0, True)
    torch.library.opcheck(op, args)
    out = torch.empty_like(q)
    args = (q, k, v, out, cu_q, cu_k, None, None, 70, 70, 0.125, False, 20, 3, 0.0, False)
    torch.library.opcheck(op, args)
    kc, vc, table = to_paged(k, v, cu_k, 16)
    used = torch.tensor(seq_k, dtype=torch.int32, device=device)
    args = (q, kc, vc, None, cu_q, cu_k, used, table, 70, 70, 0.125, True, 33, -1, 15.0, True)
    torch.library.opcheck(op, args)


def test_torch_compile(device):
    seq = [17, 40]
    q, k, v, cu_q, cu_k = make_batch(seq, seq, 4, 4, 64, torch.bfloat16, device)

    def fn(q, k, v):
        out, lse = torch.ops._fa2_C.varlen_fwd(
            q, k, v, None, cu_q, cu_k, None, None, 40, 40, 0.125, True, 8, -1, 20.0, True
        )
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
    with pytest.raises(RuntimeError, match=r"window_size_left and window_size_right must be -1"):
        f(q, k, v, cu_q, cu_k, 8, 8, window_size=(-2, 0))
    with pytest.raises(RuntimeError, match="softcap must be a finite number >= 0"):
        f(q, k, v, cu_q, cu_k, 8, 8, softcap=-1.0)
    with pytest.raises(RuntimeError, match="softcap must be a finite number >= 0"):
        f(q, k, v, cu_q, cu_k, 8, 8, softcap=float("nan"))
    with pytest.raises(RuntimeError, match="seqused_k must be int32"):
        f(q, k, v, cu_q, cu_k, 8, 8, seqused_k=torch.tensor([8, 8], device=device))
    with pytest.raises(RuntimeError, match=r"seqused_k must be 1-D of length batch \(2\)"):
        f(q, k, v, cu_q, cu_k, 8, 8, seqused_k=torch.tensor([8], dtype=torch.int32, device=device))
    with pytest.raises(RuntimeError, match="seqused_k is on cpu"):
        f(q, k, v, cu_q, cu_k, 8, 8, seqused_k=torch.tensor([8, 8], dtype=torch.int32))


def test_bad_paged_inputs(device):
    seq = [8, 20]
    q, k, v, cu_q, cu_k = make_batch(seq, seq, 4, 2, 64, torch.float16, device)
    kc, vc, table = to_paged(k, v, cu_k, 16)
    f = flash_attn_varlen_func
    with pytest.raises(RuntimeError, match="block_table must be int32, got Long"):
        f(q, kc, vc, cu_q, cu_k, 20, 20, block_table=table.long())
    with pytest.raises(RuntimeError, match="block_table is on cpu"):
        f(q, kc, vc, cu_q, cu_k, 20, 20, block_table=table.cpu())
    with pytest.raises(
        RuntimeError, match=r"block_table must be \[batch \(2\), max_blocks_per_seq\]"
    ):
        f(q, kc, vc, cu_q, cu_k, 20, 20, block_table=table[:1])
    with pytest.raises(RuntimeError, match=r"block_table must be \[batch"):
        f(q, kc, vc, cu_q, cu_k, 20, 20, block_table=table.flatten())
    with pytest.raises(RuntimeError, match="block_table must be contiguous in its last dimension"):
        wide = torch.zeros(2, 2 * table.shape[1], dtype=torch.int32, device=device)
        wide[:, ::2] = table
        f(q, kc, vc, cu_q, cu_k, 20, 20, block_table=wide[:, ::2])
    with pytest.raises(RuntimeError, match="with a block_table, k must be a paged cache"):
        f(q, k, v, cu_q, cu_k, 20, 20, block_table=table)
    with pytest.raises(RuntimeError, match="a 4-D paged cache needs a block_table"):
        f(q, kc, vc, cu_q, cu_k, 20, 20)
    with pytest.raises(
        RuntimeError, match="block_size .* must be a positive multiple of 16, got 8"
    ):
        k8 = torch.zeros(8, 8, 2, 64, dtype=torch.float16, device=device)
        f(q, k8, k8, cu_q, cu_k, 20, 20, block_table=table)
    with pytest.raises(RuntimeError, match="v must have the shape of k"):
        f(q, kc, vc[:-1], cu_q, cu_k, 20, 20, block_table=table)
    with pytest.raises(RuntimeError, match="k and v must have q's head_dim 64"):
        kw = torch.zeros(*kc.shape[:3], 128, dtype=torch.float16, device=device)
        f(q, kw, kw, cu_q, cu_k, 20, 20, block_table=table)
    with pytest.raises(RuntimeError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        k3 = torch.zeros(kc.shape[0], 16, 3, 64, dtype=torch.float16, device=device)
        f(q, k3, k3, cu_q, cu_k, 20, 20, block_table=table)
    with pytest.raises(RuntimeError, match="strides .* multiples of 8 elements"):
        # Heads of 64 elements spaced 68 apart: cache rows off the 16-byte grid.
        kp = torch.zeros(*kc.shape[:3], 68, dtype=torch.float16, device=device)[..., :64]
        f(q, kp, kp, cu_q, cu_k, 20, 20, block_table=table)


# Below the 64-row K/V tile (16: a tile spans four blocks); not a multiple of it (80: tiles
# straddle block edges, and the block-size division is not a shift); multiples of it (each tile in
# one block: the kernel's one-pointer-a-tile path), 192 again not a power of two.
BLOCK_SIZES = [16, 64, 80, 192, 256]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("heads, kv_heads", GROUPS)
@pytest.mark.parametrize("causal", [False, True])
def test_paged_matches_reference(device, dtype, block_size, heads, kv_heads, causal):
    # Prefill with a cached prefix, a decode step (one query), lengths off every block size.
    rng = random.Random(block_size + heads * 3 + kv_heads + causal)
    seq_q = [1, 7, 83, 130, 1]
    seq_k = [1, 7 + 40, 83 + 300, 130, 517]
    rng.shuffle(idx := list(range(len(seq_q))))
    seq_q, seq_k = [seq_q[i] for i in idx], [seq_k[i] for i in idx]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, heads, kv_heads, 128, dtype, device, seed=9)
    paged = to_paged(k, v, cu_k, block_size, seed=block_size)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    got = check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, out=out, paged=paged)
    assert got.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_paged_with_seqused_k_like_vllm(device, block_size):
    # vLLM passes the key counts in seqused_k and a dummy cu_seqlens_k.
    dtype = torch.bfloat16
    seq_q, seq_k = [1, 1, 33, 5], [1, 250, 64, 1000]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 8, 1, 64, dtype, device, seed=4)
    kc, vc, table = to_paged(k, v, cu_k, block_size, seed=2)
    used = torch.tensor(seq_k, dtype=torch.int32, device=device)
    dummy = torch.zeros_like(cu_k)
    scale = 0.125
    got, lse = flash_attn_varlen_func(
        q, kc, vc, cu_q, dummy, 33, 1000, scale, True, True, seqused_k=used, block_table=table
    )
    ref, ref_lse = flash_attn_varlen_ref(q, k, v, cu_q, cu_k, scale, True)
    atol, rtol = TOL[dtype]
    assert ((got.float() - ref).abs() - rtol * ref.abs()).max().item() <= atol
    assert (lse - ref_lse).abs().max().item() <= LSE_TOL[dtype]


# (left, right): one side, both, narrower and wider than a 64-key tile, zero width, wider than
# every sequence.
WINDOWS = [(0, 0), (5, -1), (-1, 3), (70, 0), (17, 90), (128, 128), (4096, 4096)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_sliding_window(device, window, causal, dtype, head_dim):
    seq_q = [1, 7, 130, 100, 9, 300]
    seq_k = [1, 44, 200, 40, 9, 301]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 8, 2, head_dim, dtype, device, seed=sum(window))
    check(q, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, window_size=window)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("heads, kv_heads", GROUPS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_paged_sliding_window_softcap(device, block_size, heads, kv_heads, head_dim):
    # The three features at once, as a Gemma-2-style layer runs them on a paged cache (128-row
    # query tiles at head dim 64, 64-row at 128).
    dtype = torch.bfloat16
    seq_q, seq_k = [1, 64, 129, 3], [700, 64, 300, 3]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, heads, kv_heads, head_dim, dtype, device, seed=1)
    paged = to_paged(k, v, cu_k, block_size, seed=3)
    for causal, window in ((True, (100, -1)), (False, (31, 9))):
        check(
            q * 4,
            k,
            v,
            cu_q,
            cu_k,
            seq_q,
            seq_k,
            causal,
            dtype,
            paged=paged,
            window_size=window,
            softcap=30.0,
        )


@pytest.mark.parametrize("softcap", [2.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_softcap(device, softcap, causal, dtype, head_dim):
    seq_q, seq_k = [1, 70, 129], [5, 70, 200]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 1, head_dim, dtype, device, seed=2)
    # Scores of tens before the cap: 2 saturates the tanh, 50 bends it.
    check(q * 6, k, v, cu_q, cu_k, seq_q, seq_k, causal, dtype, softcap=softcap)


def test_every_query_outside_the_window(device):
    # A left window that ends before the first key for every query of the first tile, and a
    # right window that starts after the last key: rows that see no key give zeros and -inf.
    dtype = torch.float16
    seq_q, seq_k = [200], [10]
    q, k, v, cu_q, cu_k = make_batch(seq_q, seq_k, 4, 4, 64, dtype, device, seed=6)
    got = check(q, k, v, cu_q, cu_k, seq_q, seq_k, False, dtype, window_size=(0, 0))
    assert (got[:190] == 0).all()
