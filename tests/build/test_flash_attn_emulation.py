"""The algorithm of kernels/flash_attn/flash_fwd_kernel.cuh emulated in torch on the CPU: its
tile schedule (64- or 128-row query tiles, 64-row key tiles from the last to the first, the
tile range cut by the causal bound and both window edges), its masks (per-row key bounds from
the window, the bottom-right causal diagonal and the end of the keys, applied only on the tiles
the kernel masks), the softcap's tanh as the kernel computes it, the paged gather of K/V rows
through the block table as each copy row resolves it, its base-2 online softmax with the -inf
guards, and P rounded to the input dtype, against the fp32 reference and the GPU tests'
tolerances. It checks the design; the CuTe mechanics are checked by the host layout test and on
the GPU."""

import math
import random

import pytest
import torch

from aphrodite_ext.ops.flash_attn import flash_attn_varlen_ref

LOG2E = 1.4426950408889634


def tanh_kernel(x):
    """The kernel's tanh: sign(x) (1 - e) / (1 + e), e = 2^(-2 log2(e) |x|)."""
    e = torch.exp2(-2.0 * LOG2E * x.abs())
    return torch.copysign((1 - e) / (1 + e), x)


def emulate(
    q,
    k,
    v,
    cu_q,
    cu_k,
    scale,
    causal,
    block_m=64,
    block_n=64,
    *,
    seqused_k=None,
    block_table=None,
    window=(-1, -1),
    softcap=0.0,
    visited=None,
):
    heads, d = q.shape[1], q.shape[2]
    group = heads // k.shape[-2]
    paged = block_table is not None
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse_out = torch.full((heads, q.shape[0]), float("nan"))
    use_softcap = softcap > 0
    score_scale = softcap if use_softcap else scale
    tanh_scale = scale / softcap if use_softcap else 0.0
    sl2 = score_scale * LOG2E
    win_left, win_right = window
    has_left = win_left >= 0
    has_right = causal or win_right >= 0
    win_right = 0 if causal else win_right
    for b in range(len(cu_q) - 1):
        q0, sq = cu_q[b], cu_q[b + 1] - cu_q[b]
        k0 = 0 if paged else cu_k[b]
        sk = seqused_k[b] if seqused_k is not None else cu_k[b + 1] - cu_k[b]
        diag = sk - sq
        for mb in range((sq + block_m - 1) // block_m):
            m0 = mb * block_m
            rows = min(block_m, sq - m0)

            # Row 0's edges clamped as the kernel clamps them (so that adding a row stays in
            # int and clips the same), then per row two int ops.
            hi_row0 = sk - 1
            if has_right:
                hi_row0 = max(min(m0 + diag + win_right, sk - 1), -block_m - 1)
            lo_row0 = -block_m
            if has_left:
                lo_row0 = max(min(m0 + diag - win_left, sk), -block_m)

            def key_hi(row, hi_row0=hi_row0, sk=sk):
                return min(sk - 1, max(hi_row0 + row, -1))

            def key_lo(row, lo_row0=lo_row0, sk=sk):
                return min(max(lo_row0 + row, 0), sk)

            hi_first, lo_last = key_hi(0), key_lo(rows - 1)
            nmax = (key_hi(rows - 1) + block_n) // block_n
            nmin = min(key_lo(0) // block_n, nmax)
            lo_row = torch.tensor([key_lo(r) for r in range(block_m)])[:, None]
            hi_row = torch.tensor([key_hi(r) for r in range(block_m)])[:, None]
            for h in range(heads):
                kh = h // group
                Q = torch.zeros(block_m, d)
                Q[:rows] = q[q0 + m0 : q0 + m0 + rows, h].float()
                m = torch.full((block_m,), -math.inf)
                row_sum = torch.zeros(block_m)
                acc = torch.zeros(block_m, d)
                for nb in range(nmax - 1, nmin - 1, -1):
                    if visited is not None and h == 0:
                        visited.append((b, mb, nb))
                    K = torch.zeros(block_n, d)
                    V = torch.zeros(block_n, d)
                    n = min(block_n, sk - nb * block_n)  # rows of the tile before the end
                    key = nb * block_n + torch.arange(n)
                    if paged:
                        bs = k.shape[1]
                        page = block_table[b][key // bs].long()  # read only for rows < sk
                        K[:n] = k[page, key % bs, kh].float()
                        V[:n] = v[page, key % bs, kh].float()
                    else:
                        K[:n] = k[k0 + key, kh].float()
                        V[:n] = v[k0 + key, kh].float()
                    S = Q @ K.T
                    if use_softcap:
                        S = tanh_kernel(S * tanh_scale)
                    key0 = nb * block_n
                    if key0 + block_n - 1 > hi_first or key0 < lo_last:
                        kk = key0 + torch.arange(block_n)[None, :]
                        S = S.masked_fill((kk < lo_row) | (kk > hi_row), -math.inf)
                    mnew = torch.maximum(m, S.max(1).values)
                    ms = torch.where(mnew == -math.inf, torch.zeros_like(mnew), mnew * sl2)
                    corr = torch.exp2(m * sl2 - ms)
                    P = torch.exp2(S * sl2 - ms[:, None])
                    row_sum = row_sum * corr + P.sum(1)
                    acc = acc * corr[:, None] + P.to(q.dtype).float() @ V
                    m = mnew
                inv = torch.where(row_sum > 0, 1 / row_sum, torch.zeros_like(row_sum))
                o = acc * inv[:, None]
                lse = torch.where(
                    row_sum > 0,
                    m * score_scale + torch.log(row_sum),
                    torch.full_like(row_sum, -math.inf),
                )
                out[q0 + m0 : q0 + m0 + rows, h] = o[:rows].to(q.dtype).float()
                lse_out[h, q0 + m0 : q0 + m0 + rows] = lse[:rows]
    return out, lse_out


def visible(sq, sk, causal, window):
    """[sq, sk] bool: which keys each query sees (the reference's mask, stated on its own)."""
    left, right = window
    right = 0 if causal else right
    pos = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        ok &= j <= pos + right
    if left >= 0:
        ok &= j >= pos - left
    return ok


def make(seq_q, seq_k, heads, kv_heads, d, dtype, seed, block_size=None, spare_blocks=3):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(seq_q), heads, d, generator=gen).to(dtype)
    cu_q = [0, *torch.tensor(seq_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(seq_k).cumsum(0).tolist()]
    if block_size is None:
        k = torch.randn(sum(seq_k), kv_heads, d, generator=gen).to(dtype)
        v = torch.randn(sum(seq_k), kv_heads, d, generator=gen).to(dtype)
        return q, k, v, cu_q, cu_k, None
    # Paged: each sequence's blocks drawn from a shuffled pool; unused table entries hold
    # out-of-range indices, which must never be read.
    per_seq = [(s + block_size - 1) // block_size for s in seq_k]
    width = max(per_seq) + 1
    num_blocks = sum(per_seq) + spare_blocks
    k = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(seq_k), width), 10**6, dtype=torch.int32)
    for b, n in enumerate(per_seq):
        table[b, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
    return q, k, v, cu_q, cu_k, table


def compare(out, lse, ref, ref_lse, dtype):
    assert not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    if finite.any():
        assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-4
    atol, rtol = (1e-2, 1e-2) if dtype == torch.bfloat16 else (2e-3, 2e-3)
    assert ((out - ref).abs() - rtol * ref.abs()).max() <= atol


def check(q, k, v, cu_q, cu_k, scale, causal, dtype, block_m=64, **options):
    """Runs the emulated kernel and the reference on one problem and compares them. options:
    block_table, window, softcap, seqused_k (a list) and visited (the emulation's tile log).
    Returns the reference's (out, lse)."""
    visited = options.pop("visited", None)
    out, lse = emulate(q, k, v, cu_q, cu_k, scale, causal, block_m, visited=visited, **options)
    used = options.get("seqused_k")
    ref, ref_lse = flash_attn_varlen_ref(
        q,
        k,
        v,
        torch.tensor(cu_q),
        torch.tensor(cu_k),
        scale,
        causal,
        seqused_k=None if used is None else torch.tensor(used, dtype=torch.int32),
        block_table=options.get("block_table"),
        window_size=options.get("window", (-1, -1)),
        softcap=options.get("softcap", 0.0),
    )
    compare(out, lse, ref, ref_lse, dtype)
    return ref, ref_lse


def check_tiles_tight(visited, seq_q, seq_k, causal, window, block_m, block_n=64):
    """The first and the last key tile a CTA visits hold a key that one of its rows sees, and
    no tile outside the visited range holds one: the skip is exact at both ends."""
    ranges = {}
    for b, mb, nb in visited:
        lo, hi = ranges.get((b, mb), (nb, nb))
        ranges[(b, mb)] = (min(lo, nb), max(hi, nb))
    for b, (sq, sk) in enumerate(zip(seq_q, seq_k, strict=True)):
        vis = visible(sq, sk, causal, window)
        for mb in range((sq + block_m - 1) // block_m):
            rows = vis[mb * block_m : (mb + 1) * block_m]
            keys = rows.any(0).nonzero().flatten()
            if keys.numel() == 0:
                assert (b, mb) not in ranges
                continue
            assert ranges[(b, mb)] == (keys.min().item() // block_n, keys.max().item() // block_n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m", [64, 128])
def test_emulated_kernel_matches_reference(dtype, causal, block_m):
    # A single token, lengths off the tiles, a query longer than its keys (rows with no key).
    seq_q = [1, 7, 130, 100, 9]
    seq_k = [1, 44, 200, 40, 9]
    q, k, v, cu_q, cu_k, _ = make(seq_q, seq_k, 4, 2, 32, dtype, block_m + causal)
    check(q, k, v, cu_q, cu_k, 0.2, causal, dtype, block_m)


# (left, right): each side alone, both, narrower and wider than a tile, zero-width, a window
# wider than every sequence.
WINDOWS = [(-1, -1), (0, 0), (5, -1), (-1, 3), (70, 0), (17, 90), (100, 100), (1000, 2000)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m", [64, 128])
def test_windows_match_reference_and_skip_exactly(window, causal, block_m):
    seq_q = [1, 7, 130, 100, 9, 300]
    seq_k = [1, 44, 200, 40, 9, 301]
    dtype = torch.bfloat16
    q, k, v, cu_q, cu_k, _ = make(seq_q, seq_k, 2, 1, 32, dtype, sum(window) + block_m)
    visited = []
    check(q, k, v, cu_q, cu_k, 0.2, causal, dtype, block_m, window=window, visited=visited)
    check_tiles_tight(visited, seq_q, seq_k, causal, window, block_m)


@pytest.mark.parametrize("softcap", [2.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_softcap_matches_reference(softcap, dtype):
    seq_q, seq_k = [1, 70, 129], [5, 70, 200]
    q, k, v, cu_q, cu_k, _ = make(seq_q, seq_k, 4, 1, 64, dtype, int(softcap))
    # Scores up to ~+-40 before the cap: the cap saturates for 2 and bends for 30.
    q = (q.float() * 5).to(dtype)
    for causal, window in ((False, (-1, -1)), (True, (50, -1))):
        check(q, k, v, cu_q, cu_k, 0.125, causal, dtype, window=window, softcap=softcap)


def test_kernel_tanh_is_accurate():
    x = torch.linspace(-30, 30, 200001, dtype=torch.float64)
    err = (tanh_kernel(x.float()).double() - torch.tanh(x)).abs().max().item()
    assert err <= 4e-7, err


@pytest.mark.parametrize("block_size", [16, 32, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_matches_dense_reference(block_size, causal):
    seq_q = [1, 7, 130, 9, 1]
    seq_k = [17, 44, 200, 9, 300]
    dtype = torch.float16
    q, kc, vc, cu_q, cu_k, table = make(seq_q, seq_k, 4, 2, 32, dtype, block_size, block_size)
    window = (40, -1) if causal else (-1, -1)
    paged = check(q, kc, vc, cu_q, cu_k, 0.2, causal, dtype, block_table=table, window=window)
    # The reference on the same keys laid out densely (a gather written independently).
    k = torch.cat(
        [
            kc[table[b, : (s + block_size - 1) // block_size].long()].flatten(0, 1)[:s]
            for b, s in enumerate(seq_k)
        ]
    )
    v = torch.cat(
        [
            vc[table[b, : (s + block_size - 1) // block_size].long()].flatten(0, 1)[:s]
            for b, s in enumerate(seq_k)
        ]
    )
    dense = check(q, k, v, cu_q, cu_k, 0.2, causal, dtype, window=window)
    # And the reference's own paged path agrees with its dense one.
    torch.testing.assert_close(paged, dense)


def test_seqused_k_overrides_cu_seqlens_k():
    # vLLM's paged call: cu_seqlens_k is a dummy, seqused_k gives the key counts.
    seq_q, seq_k = [3, 64, 1], [40, 64, 129]
    dtype = torch.bfloat16
    q, kc, vc, cu_q, _, table = make(seq_q, seq_k, 8, 1, 32, dtype, 7, 16)
    dummy = [0] * (len(seq_q) + 1)
    check(
        q, kc, vc, cu_q, dummy, 0.2, True, dtype, seqused_k=seq_k, block_table=table, softcap=10.0
    )


def test_random_problems():
    rng = random.Random(11)
    for trial in range(12):
        n = rng.randint(1, 4)
        seq_q = [rng.choice([1, 2, 63, 64, 65, 129, rng.randint(1, 300)]) for _ in range(n)]
        seq_k = [max(0, s + rng.choice([0, 0, 1, -1, 17, 200, -s // 2])) for s in seq_q]
        causal = rng.random() < 0.5
        window = (rng.choice([-1, 0, 3, 64, 150]), rng.choice([-1, 0, 5, 64]))
        softcap = rng.choice([0.0, 0.0, 5.0])
        block_size = rng.choice([None, 16, 48, 64])
        block_m = rng.choice([64, 128])
        q, k, v, cu_q, cu_k, table = make(seq_q, seq_k, 4, 2, 32, torch.bfloat16, trial, block_size)
        visited = []
        options = dict(block_table=table, window=window, softcap=softcap, visited=visited)
        check(q, k, v, cu_q, cu_k, 0.3, causal, torch.bfloat16, block_m, **options)
        check_tiles_tight(visited, seq_q, seq_k, causal, window, block_m)
