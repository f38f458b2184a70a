"""FA2-style flash attention forward over packed variable-length batches (kernels/flash_attn,
module _fa2_C, CUDA only): dense or paged K/V, causal and sliding-window masks, logit softcap."""

from __future__ import annotations

import math

import torch

from .. import load


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_softmax_lse: bool = False,
    out: torch.Tensor | None = None,
    *,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention per sequence of a packed batch, accumulated in fp32.

    q [total_q, num_heads, head_dim], k/v [total_k, num_kv_heads, head_dim] (fp16 or bf16, the
    last dim contiguous, rows 16-byte aligned); sequence b owns rows cu_seqlens[b] to
    cu_seqlens[b + 1] (int32 on q's device). num_kv_heads divides num_heads (GQA/MQA).

    Paged K/V: with ``block_table`` [batch, max_blocks_per_seq] (int32), k and v are caches
    [num_blocks, block_size, num_kv_heads, head_dim] (block_size a multiple of 16) and key j of
    sequence b is k[block_table[b, j // block_size], j % block_size]. The key count of sequence
    b is ``seqused_k[b]`` (int32 [batch], as vLLM passes it) or else cu_seqlens_k[b + 1] -
    cu_seqlens_k[b]. Table entries past a sequence's last key are never read; the others are
    not checked on the device and must be valid block indices.

    Masks are bottom-right aligned: query i of a sequence sits at key position
    pos = i + len_k - len_q and sees keys pos - window_size[0] <= j <= pos + window_size[1]
    (-1: unbounded on that side; causal sets the right side to 0). A query that sees no key gets
    zeros and an LSE of -inf. softcap > 0 replaces each score s = scale * q.k by
    softcap * tanh(s / softcap) (FA2 semantics; the LSE is of the capped scores).
    softmax_scale defaults to 1/sqrt(head_dim). Returns out, or (out, lse [num_heads, total_q]
    fp32, natural log).
    """
    load("_fa2_C")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    window_left, window_right = window_size
    result, lse = torch.ops._fa2_C.varlen_fwd(
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
        return_softmax_lse,
    )
    # With `out` given the op writes there and returns an empty first output.
    result = out if out is not None else result
    return (result, lse) if return_softmax_lse else result


def flash_attn_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    *,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference: plain softmax attention per sequence, with the arguments of
    flash_attn_varlen_func. Returns (out fp32 [total_q, heads, head_dim], lse fp32 [heads,
    total_q]); rows that see no key give zeros and -inf."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[-2]
    group = heads // kv_heads
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    window_left, window_right = window_size
    if causal:
        window_right = 0
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((heads, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    for b in range(len(cq) - 1):
        q0, q1 = cq[b], cq[b + 1]
        sq = q1 - q0
        sk = used[b] if used is not None else ck[b + 1] - ck[b]
        if sq == 0:
            continue
        if block_table is not None:
            j = torch.arange(sk, device=k.device)
            block_size = k.shape[1]
            blocks = block_table[b].to(k.device).long()[j // block_size]
            kb, vb = k[blocks, j % block_size], v[blocks, j % block_size]
        else:
            kb, vb = k[ck[b] : ck[b] + sk], v[ck[b] : ck[b] + sk]
        qb = q[q0:q1].float().transpose(0, 1)  # [heads, sq, d]
        kb = kb.float().repeat_interleave(group, dim=1).transpose(0, 1)
        vb = vb.float().repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.matmul(qb, kb.transpose(1, 2)) * softmax_scale  # [heads, sq, sk]
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=q.device)[None, :]
        masked = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
        if window_right >= 0:
            masked |= j > pos + window_right
        if window_left >= 0:
            masked |= j < pos - window_left
        s = s.masked_fill(masked, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf where a row sees no key
        p = torch.exp(s - row_lse[..., None].clamp(min=-1e30))
        p = torch.nan_to_num(p, nan=0.0)
        out[q0:q1] = torch.matmul(p, vb).transpose(0, 1)
        lse[:, q0:q1] = row_lse
    return out, lse
