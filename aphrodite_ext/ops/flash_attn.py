"""FA2-style flash attention forward over packed variable-length batches (kernels/flash_attn,
module _fa2_C, CUDA only)."""

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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention per sequence of a packed batch, accumulated in fp32.

    q [total_q, num_heads, head_dim], k/v [total_k, num_kv_heads, head_dim] (fp16 or bf16, the
    last dim contiguous, rows 16-byte aligned); sequence b owns rows cu_seqlens[b] to
    cu_seqlens[b + 1] (int32 on q's device). num_kv_heads divides num_heads (GQA/MQA). Causal
    masks are bottom-right aligned (query i of a sequence sees keys j <= i + len_k - len_q); a
    query that sees no key gets zeros and an LSE of -inf. softmax_scale defaults to
    1/sqrt(head_dim). Returns out, or (out, lse [num_heads, total_q] fp32, natural log).
    """
    load("_fa2_C")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    result, lse = torch.ops._fa2_C.varlen_fwd(
        q,
        k,
        v,
        out,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference: plain softmax attention per sequence. Returns (out fp32 [total_q, heads,
    head_dim], lse fp32 [heads, total_q]); masked-out rows give zeros and -inf."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((heads, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        sq, sk = q1 - q0, k1 - k0
        if sq == 0:
            continue
        qb = q[q0:q1].float().transpose(0, 1)  # [heads, sq, d]
        kb = k[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vb = v[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.matmul(qb, kb.transpose(1, 2)) * softmax_scale  # [heads, sq, sk]
        if causal:
            i = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(sk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (sk - sq), -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf where a row sees no key
        p = torch.exp(s - row_lse[..., None].clamp(min=-1e30))
        p = torch.nan_to_num(p, nan=0.0)
        out[q0:q1] = torch.matmul(p, vb).transpose(0, 1)
        lse[:, q0:q1] = row_lse
    return out, lse
