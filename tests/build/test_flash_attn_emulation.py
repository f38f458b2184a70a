"""The algorithm of kernels/flash_attn/flash_fwd_kernel.cuh emulated in torch on the CPU: its
tile schedule (64- or 128-row query tiles, 64-row key tiles from the last to the first, the
causal tile bound), its masks (partial end, bottom-right causal diagonal, applied only on the
tiles the kernel masks), its base-2 online softmax with the -inf guards, and P rounded to the
input dtype, against the fp32 reference and the GPU tests' tolerances. It checks the design;
the CuTe mechanics are checked by the host layout test and on the GPU."""

import math

import pytest
import torch

from aphrodite_ext.ops.flash_attn import flash_attn_varlen_ref

LOG2E = 1.4426950408889634


def emulate(q, k, v, cu_q, cu_k, scale, causal, block_m=64, block_n=64):
    heads, d = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse_out = torch.full((heads, q.shape[0]), float("nan"))
    sl2 = scale * LOG2E
    for b in range(len(cu_q) - 1):
        q0, sq = cu_q[b], cu_q[b + 1] - cu_q[b]
        k0, sk = cu_k[b], cu_k[b + 1] - cu_k[b]
        diag = sk - sq
        for h in range(heads):
            kh = h // group
            for mb in range((sq + block_m - 1) // block_m):
                rows = min(block_m, sq - mb * block_m)
                nmax = (sk + block_n - 1) // block_n
                if causal:
                    last = mb * block_m + rows - 1 + diag
                    nmax = 0 if last < 0 else min(nmax, last // block_n + 1)
                Q = torch.zeros(block_m, d)
                Q[:rows] = q[q0 + mb * block_m : q0 + mb * block_m + rows, h].float()
                m = torch.full((block_m,), -math.inf)
                row_sum = torch.zeros(block_m)
                acc = torch.zeros(block_m, d)
                for nb in range(nmax - 1, -1, -1):
                    K = torch.zeros(block_n, d)
                    V = torch.zeros(block_n, d)
                    n = min(block_n, sk - nb * block_n)
                    K[:n] = k[k0 + nb * block_n : k0 + nb * block_n + n, kh].float()
                    V[:n] = v[k0 + nb * block_n : k0 + nb * block_n + n, kh].float()
                    S = Q @ K.T
                    key = nb * block_n + torch.arange(block_n)[None, :]
                    qi = mb * block_m + torch.arange(block_m)[:, None]
                    partial = nb * block_n + block_n > sk
                    diagonal = causal and nb * block_n + block_n - 1 > mb * block_m + diag
                    if partial or diagonal:
                        mask = (key >= sk) | ((key > qi + diag) if causal else False)
                        S = S.masked_fill(mask, -math.inf)
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
                    row_sum > 0, m * scale + torch.log(row_sum), torch.full_like(row_sum, -math.inf)
                )
                out[q0 + mb * block_m : q0 + mb * block_m + rows, h] = o[:rows].to(q.dtype).float()
                lse_out[h, q0 + mb * block_m : q0 + mb * block_m + rows] = lse[:rows]
    return out, lse_out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m", [64, 128])
def test_emulated_kernel_matches_reference(dtype, causal, block_m):
    gen = torch.Generator().manual_seed(block_m + causal)
    # A single token, lengths off the tiles, a query longer than its keys (rows with no key).
    seq_q = [1, 7, 130, 100, 9]
    seq_k = [1, 44, 200, 40, 9]
    heads, kv_heads, d = 4, 2, 32
    q = torch.randn(sum(seq_q), heads, d, generator=gen).to(dtype)
    k = torch.randn(sum(seq_k), kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(sum(seq_k), kv_heads, d, generator=gen).to(dtype)
    cu_q = [0, *torch.tensor(seq_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(seq_k).cumsum(0).tolist()]
    out, lse = emulate(q, k, v, cu_q, cu_k, 0.2, causal, block_m)
    ref, ref_lse = flash_attn_varlen_ref(
        q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), 0.2, causal
    )
    assert not torch.isnan(lse).any()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-4
    atol, rtol = (1e-2, 1e-2) if dtype == torch.bfloat16 else (2e-3, 2e-3)
    assert ((out - ref).abs() - rtol * ref.abs()).max() <= atol
