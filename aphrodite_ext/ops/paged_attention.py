"""Decode attention over a paged KV cache (kernels/attention): vLLM's paged_attention_v1/v2
and the Transformer-XL relative-position variant, with the fp32 reference beside them.

The caches use the layout reshape_and_cache writes:
  key_cache   [num_blocks, num_kv_heads, head_size // x, block_size, x], x = 16 // element size
  value_cache [num_blocks, num_kv_heads, head_size, block_size]
"""

from __future__ import annotations

import functools
import math

import torch

from .. import load

#: The v2 ops' default partition size (vLLM's, by which its callers size the scratch).
PARTITION_SIZE = 512
#: split_kv splits a sequence into at most ceil(max_seq_len / MIN_PARTITION_SIZE) partitions
#: (shorter ones lost on an H200; rounding to whole steps can still leave some under it).
MIN_PARTITION_SIZE = 64


def _scale_tensor(value: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor([float(value)], dtype=torch.float32, device=device)


def v2_scratch(
    num_seqs: int,
    num_heads: int,
    head_size: int,
    max_seq_len: int,
    device: torch.device,
    partition_size: int = PARTITION_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(exp_sums, max_logits, tmp_out), float32, for max_seq_len tokens in partitions of
    partition_size."""
    parts = max(1, math.ceil(max_seq_len / partition_size))
    kw = dict(dtype=torch.float32, device=device)
    return (
        torch.empty(num_seqs, num_heads, parts, **kw),
        torch.empty(num_seqs, num_heads, parts, **kw),
        torch.empty(num_seqs, num_heads, parts, head_size, **kw),
    )


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_kv(
    version: str,
    max_seq_len: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    device: torch.device,
    heads_per_block: int = 16,
) -> int:
    """How paged_attention and xl_paged_attention run `version` ("auto", "v1" or "v2"): 0 for
    v1 (one pass), else v2's partition size in tokens.

    On a CUDA GPU, v1 runs ceil(group / heads_per_block) thread blocks a (sequence, KV head),
    group = num_heads / num_kv_heads (heads_per_block: 16 for the tensor-core kernel, 8 for the
    staged one). "auto" runs v2 past 8192 tokens, or past PARTITION_SIZE while those blocks leave
    at least half the SMs idle; v2 splits the longest sequence into as many partitions as keep
    its grid within one block an SM, at least ceil(max_seq_len / PARTITION_SIZE) and at most
    ceil(max_seq_len / MIN_PARTITION_SIZE), each a whole number of 16-token steps (cache blocks,
    where longer). H200, GQA 32/8, head 128, cold L2 (kernels/attention/NOTES.md): one sequence
    of 1024 tokens 11.2 us over 16 partitions against 17.8 over 2 (23.1 with v1), 8 sequences
    20.5 over 2 (23.3 with v1), 16 sequences 24.4 with v1 (30.0 over 2). Elsewhere (the CPU, ROCm:
    not measured) vLLM's rule: v2 past 8192 tokens, or past 512 while num_seqs x num_heads < 512,
    in PARTITION_SIZE-token partitions."""
    if version not in ("auto", "v1", "v2"):
        raise ValueError(f"version must be 'auto', 'v1' or 'v2', got {version!r}")
    if device.type != "cuda" or torch.version.hip is not None:
        if version == "auto":
            v2 = max_seq_len > 8192 or (max_seq_len > PARTITION_SIZE and num_seqs * num_heads < 512)
            return PARTITION_SIZE if v2 else 0
        return PARTITION_SIZE if version == "v2" else 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    group = max(1, num_heads // max(1, num_kv_heads))
    blocks = max(1, num_seqs * num_kv_heads * math.ceil(group / heads_per_block))
    fill = _sm_count(index) // blocks
    if version == "v1" or (
        version == "auto"
        and not (max_seq_len > 8192 or (max_seq_len > PARTITION_SIZE and fill >= 2))
    ):
        return 0
    tokens = max(1, max_seq_len)
    least = math.ceil(tokens / PARTITION_SIZE)
    parts = max(least, min(fill, math.ceil(tokens / MIN_PARTITION_SIZE)))
    step = max(16, block_size)
    return step * math.ceil(math.ceil(tokens / parts) / step)


def _heads_per_block(query: torch.Tensor, kv_cache_dtype: str) -> int:
    """Query heads a thread block of the CUDA kernels serves: 16 for the tensor-core kernel
    (16-bit queries over a cache of their dtype), else 8 (the staged kernel). Where the launcher
    still runs the staged kernel (a build without the tensor-core one, a GPU without the shared
    memory it needs) a group of 9-16 heads takes twice the blocks split_kv counts: a slower
    split, not a wrong one."""
    tensor_core = query.dtype in (torch.float16, torch.bfloat16) and kv_cache_dtype == "auto"
    return 16 if tensor_core and query.shape[-1] % 16 == 0 else 8


def _run(v1, v2, out, args, query, key_cache, value_cache, max_seq_len, kv_cache_dtype, version):
    """v1(out, *args), or v2(out, *scratch, *args) in split_kv's partitions."""
    num_seqs, num_heads, head_size = query.shape
    partition = split_kv(
        version, max_seq_len, num_seqs, num_heads, key_cache.shape[1], value_cache.shape[3],
        query.device, _heads_per_block(query, kv_cache_dtype),
    )  # fmt: skip
    if partition:
        scratch = v2_scratch(num_seqs, num_heads, head_size, max_seq_len, query.device, partition)
        v2(out, *scratch, *args, partition_size=partition)
    else:
        v1(out, *args)
    return out


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    out: torch.Tensor | None = None,
    version: str = "auto",
) -> torch.Tensor:
    """Attention of one query token per sequence ([num_seqs, num_heads, head_size]) over its
    cached tokens. version: "v1" (one pass), "v2" (split into partitions, then reduced) or
    "auto" (split_kv says which and how)."""
    load("_C")
    out = torch.empty_like(query) if out is None else out
    args = (
        query,
        key_cache,
        value_cache,
        key_cache.shape[1],
        scale,
        block_tables,
        seq_lens,
        value_cache.shape[3],
        max_seq_len,
        alibi_slopes,
        kv_cache_dtype,
        _scale_tensor(k_scale, query.device),
        _scale_tensor(v_scale, query.device),
    )
    ops = torch.ops._C
    return _run(
        ops.paged_attention_v1, ops.paged_attention_v2, out, args, query, key_cache, value_cache,
        max_seq_len, kv_cache_dtype, version,
    )  # fmt: skip


def xl_paged_attention(
    query: torch.Tensor,
    pos_bias_u: torch.Tensor,
    matrix_bd: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    kv_cache_dtype: str = "auto",
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    out: torch.Tensor | None = None,
    version: str = "auto",
) -> torch.Tensor:
    """Transformer-XL decode attention: score_j = scale * ((q + pos_bias_u) . k_j +
    matrix_bd[s, h, j]) (matrix_bd: [num_seqs, num_heads, >= max_seq_len]): the content and
    position terms are summed, then scaled, as in Transformer-XL."""
    load("_C")
    out = torch.empty_like(query) if out is None else out
    args = (
        query,
        pos_bias_u,
        matrix_bd,
        key_cache,
        value_cache,
        key_cache.shape[1],
        scale,
        block_tables,
        seq_lens,
        value_cache.shape[3],
        max_seq_len,
        kv_cache_dtype,
        _scale_tensor(k_scale, query.device),
        _scale_tensor(v_scale, query.device),
    )
    ops = torch.ops._C
    return _run(
        ops.xl_paged_attention_v1, ops.xl_paged_attention_v2, out, args, query, key_cache,
        value_cache, max_seq_len, kv_cache_dtype, version,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------
# fp32 reference: gathers each sequence's keys and values out of the paged cache and runs
# plain softmax attention on them. Written independently of the kernels.


def e4m3_to_float(raw: torch.Tensor) -> torch.Tensor:
    """The value of E4M3 ("e4m3fn") bytes as float32, decoded bit by bit (no torch fp8 type)."""
    b = raw.view(torch.uint8).to(torch.int32)
    sign = torch.where(b >= 128, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).float()
    normal = (1.0 + man / 8.0) * torch.pow(2.0, (exp - 7).float())
    subnormal = man / 8.0 * 2.0**-6
    value = sign * torch.where(exp == 0, subnormal, normal)
    return torch.where((exp == 0xF) & ((b & 0x7) == 0x7), float("nan"), value)


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values as float32 [seq_len, num_kv_heads, head_size]."""
    num_kv_heads, head_size, block_size = value_cache.shape[1:]
    blocks = block_table[: (seq_len + block_size - 1) // block_size].long()
    # key_cache[b, h, c, t, i] holds dim c * x + i of token t: move t next to b, merge (c, i).
    k = key_cache[blocks].permute(0, 3, 1, 2, 4).reshape(-1, num_kv_heads, head_size)[:seq_len]
    # value_cache[b, h, d, t]: move t next to b.
    v = value_cache[blocks].permute(0, 3, 1, 2).reshape(-1, num_kv_heads, head_size)[:seq_len]
    if kv_cache_dtype == "auto":
        return k.float(), v.float()
    return e4m3_to_float(k) * k_scale, e4m3_to_float(v) * v_scale


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    pos_bias_u: torch.Tensor | None = None,
    matrix_bd: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 decode attention, one sequence at a time, in the query's dtype."""
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = value_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float32, device=query.device)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        if n == 0:
            continue
        k, v = gather_kv(
            key_cache, value_cache, block_tables[s], n, kv_cache_dtype, k_scale, v_scale
        )
        k = k.repeat_interleave(group, dim=1)  # [n, num_heads, d]
        v = v.repeat_interleave(group, dim=1)
        q = query[s].float()
        if pos_bias_u is not None:
            q = q + pos_bias_u[s].float()
        scores = scale * torch.einsum("hd,nhd->hn", q, k)  # [num_heads, n]
        if alibi_slopes is not None:
            positions = torch.arange(n, device=query.device) - (n - 1)
            scores = scores + alibi_slopes.float()[:, None] * positions[None, :]
        if matrix_bd is not None:
            scores = scores + scale * matrix_bd[s, :, :n].float()
        probs = torch.softmax(scores, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, v)
    return out.to(query.dtype)
