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
#: Past LONG_SEQ_LEN tokens "auto" runs v2 in partitions of at most LONG_PARTITION_SIZE, so that
#: a long sequence among short ones does not leave its few blocks running alone at the end.
LONG_SEQ_LEN = 8192
LONG_PARTITION_SIZE = 4096

# The tensor-core kernel's cost model (split_kv): microseconds of a v1 and of a v2 launch
# (the reduce included) beyond the blocks' tokens, and the tokens a microsecond one block of 4
# warps (narrow) or of 8 (wide) gets through at head size 128. Fitted to every v1 / v2 split
# (partitions of 64-8192 tokens, 4 and 8 warps) of 1-16 sequences of 1024-65536 tokens, bf16,
# GQA 32/8, block 16, on an H100 and an H200 (kernels/attention/NOTES.md), for the least loss
# on both: the split it picks ran at 0.97 (H100) and 0.99 (H200) of the best split's speed on
# average, 0.88 and 0.92 at worst.
_MMA_V1_US, _MMA_V2_US = 6.0, 11.0
_MMA_NARROW_RATE, _MMA_WIDE_RATE = 62.0, 110.0
#: Warps of a wide block (paged_attention_launch.cuh's kMmaWideWarps).
_MMA_WIDE_WARPS = 8


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


def _index(device: torch.device) -> int:
    """A CUDA device's index (the current device's where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _mma_warps(
    device_index: int,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    head_size: int,
    block_size: int,
    xl: bool,
) -> int:
    """The warps of the tensor-core kernel's blocks that the launcher can run these problems
    with on GPU device_index: 8 where its wide blocks fit too, 4 where only 4-warp ones do, 0
    where they run in the staged kernel (no tensor-core kernel for these types, or in this
    build: generator options paged_attention.kernel / wide / xl; or not room enough on this
    GPU). The op asks the launcher's own test (paged_attention_launch.cuh's mma_block_warps)."""
    load("_C")
    return int(
        torch.ops._C._paged_attention_mma_warps(
            device_index, dtype, kv_cache_dtype, head_size, block_size, xl
        )
    )


def split_kv(
    version: str,
    max_seq_len: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    device: torch.device,
    *,
    mma_warps: int = _MMA_WIDE_WARPS,
    head_size: int = 128,
) -> int:
    """How paged_attention and xl_paged_attention run `version` ("auto", "v1" or "v2"): 0 for
    v1 (one pass), else v2's partition size in tokens, a whole number of steps (16 tokens, or
    the cache block where longer).

    On a CUDA GPU, v1 runs ceil(group / heads) thread blocks a (sequence, KV head), group =
    num_heads / num_kv_heads, heads = 16 for the tensor-core kernel and 8 for the staged one,
    and v2 that many a partition. mma_warps (what _mma_warps says of the problems on this GPU;
    partition_for asks it, a direct call assumes a default build on an sm_90 GPU): 8 where the
    tensor-core kernel's 8-warp (wide) blocks can run, 4 where only its 4-warp ones can, 0
    where the staged kernel runs.

    The tensor-core kernel runs wide blocks where they can run, its grid fits one block an SM
    and each warp gets a step (paged_attention_launch.cuh's mma_wide), else 4-warp ones. Its
    split is the cheapest under _mma_partitions' cost model of v1, the most partitions that
    keep the grid within one block an SM (at least a step a warp), and the most within three
    quarters of the SMs (at least MIN_PARTITION_SIZE tokens each), partitions of a power of two
    tokens, each option raised to a floor first: past LONG_SEQ_LEN tokens ceil(max_seq_len /
    LONG_PARTITION_SIZE) partitions; for "v2" ceil(max_seq_len / PARTITION_SIZE), so that it
    splits what it is asked to.

    The staged kernel: "auto" runs v2 past LONG_SEQ_LEN tokens, or past PARTITION_SIZE while
    the blocks leave at least half the SMs idle; v2 splits the longest sequence into as many
    partitions as keep its grid within one block an SM, at least ceil(max_seq_len /
    PARTITION_SIZE) and at most ceil(max_seq_len / MIN_PARTITION_SIZE). Elsewhere (the CPU,
    ROCm: not measured) vLLM's rule: v2 past 8192 tokens, or past 512 while num_seqs x
    num_heads < 512, in PARTITION_SIZE-token partitions."""
    if version not in ("auto", "v1", "v2"):
        raise ValueError(f"version must be 'auto', 'v1' or 'v2', got {version!r}")
    if mma_warps not in (0, 4, _MMA_WIDE_WARPS):
        raise ValueError(f"mma_warps must be 0, 4 or {_MMA_WIDE_WARPS}, got {mma_warps!r}")
    if device.type != "cuda" or torch.version.hip is not None:
        if version == "auto":
            v2 = max_seq_len > 8192 or (max_seq_len > PARTITION_SIZE and num_seqs * num_heads < 512)
            return PARTITION_SIZE if v2 else 0
        return PARTITION_SIZE if version == "v2" else 0
    if version == "v1":
        return 0
    sms = _sm_count(_index(device))
    group = max(1, num_heads // max(1, num_kv_heads))
    blocks = max(1, num_seqs * num_kv_heads * math.ceil(group / (16 if mma_warps else 8)))
    tokens = max(1, max_seq_len)
    step = max(16, block_size)
    if mma_warps:
        fits = mma_warps == _MMA_WIDE_WARPS
        least = math.ceil(tokens / LONG_PARTITION_SIZE) if tokens > LONG_SEQ_LEN else 1
        if version == "v2":
            least = max(least, math.ceil(tokens / PARTITION_SIZE))
        parts = _mma_partitions(tokens, blocks, sms, step, head_size, fits, least)
        size = _power_of_two_partition(tokens, parts)
        return 0 if version == "auto" and size >= tokens else size
    fill = sms // blocks
    if version == "auto" and not (tokens > LONG_SEQ_LEN or (tokens > PARTITION_SIZE and fill >= 2)):
        return 0
    least = math.ceil(tokens / PARTITION_SIZE)
    parts = max(least, min(fill, math.ceil(tokens / MIN_PARTITION_SIZE)))
    return step * math.ceil(math.ceil(tokens / parts) / step)


def _power_of_two_partition(tokens: int, parts: int) -> int:
    """The least power of two, at least MIN_PARTITION_SIZE (a whole number of steps), that
    splits `tokens` into at most `parts` partitions."""
    size = MIN_PARTITION_SIZE
    while size * parts < tokens:
        size *= 2
    return size


def _mma_wide(grid: int, tokens: int, step: int, sms: int, wide_fits: bool) -> bool:
    """Whether the tensor-core kernel runs wide blocks for a grid of `grid` blocks whose
    partitions hold `tokens` tokens (the partition size, or the longest sequence where it is
    shorter; wide_fits: whether wide blocks can run, _mma_warps == 8): paged_attention_launch.cuh's
    mma_wide (tests/kernels/test_paged_attention.py holds the two to each other on the GPU)."""
    return wide_fits and grid <= sms and tokens >= _MMA_WIDE_WARPS * step


def _mma_partitions(
    tokens: int, blocks: int, sms: int, step: int, head_size: int, wide_fits: bool, least: int
) -> int:
    """split_kv's partitions for the tensor-core kernel, `blocks` a partition on `sms` SMs
    (wide_fits: whether wide blocks can run): the cheapest of v1, the
    most partitions within one block an SM with a step for each warp of a wide block, and the
    most within 3/4 of the SMs, each at least `least` (split_kv's floor) and in partitions of a
    power of two tokens, wide where _mma_wide says so."""

    def cost(parts: int) -> float:
        size = _power_of_two_partition(tokens, parts)
        parts = math.ceil(tokens / size) if size < tokens else 1
        wide = _mma_wide(blocks * parts, min(size, tokens), step, sms, wide_fits)
        rate = (_MMA_WIDE_RATE if wide else _MMA_NARROW_RATE) * 128 / head_size
        return (_MMA_V1_US if parts == 1 else _MMA_V2_US) + math.ceil(tokens / parts) / rate

    options = [
        1,
        min(sms // blocks, tokens // (_MMA_WIDE_WARPS * step)),
        min(3 * sms // 4 // blocks, math.ceil(tokens / MIN_PARTITION_SIZE)),
    ]
    return min((max(least, parts) for parts in options), key=cost)


def partition_for(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    max_seq_len: int,
    kv_cache_dtype: str = "auto",
    version: str = "auto",
    xl: bool = False,
) -> int:
    """split_kv's answer for the wrappers' call on these tensors (xl: the XL op's): 0 for v1,
    else v2's partition size."""
    num_seqs, num_heads, head_size = query.shape
    block_size = value_cache.shape[3]
    warps = 0  # the staged kernel's (fp8 caches, and off CUDA GPUs, ask nothing)
    gpu = query.device.type == "cuda" and torch.version.hip is None
    if gpu and kv_cache_dtype == "auto" and version != "v1":
        warps = _mma_warps(
            _index(query.device), query.dtype, kv_cache_dtype, head_size, block_size, xl
        )
    return split_kv(
        version, max_seq_len, num_seqs, num_heads, key_cache.shape[1], block_size, query.device,
        mma_warps=warps, head_size=head_size,
    )  # fmt: skip


def _run(
    v1, v2, out, args, query, key_cache, value_cache, max_seq_len, kv_cache_dtype, version, xl
):
    """v1(out, *args), or v2(out, *scratch, *args) in split_kv's partitions."""
    num_seqs, num_heads, head_size = query.shape
    partition = partition_for(
        query, key_cache, value_cache, max_seq_len, kv_cache_dtype, version, xl
    )
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
        max_seq_len, kv_cache_dtype, version, False,
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
        value_cache, max_seq_len, kv_cache_dtype, version, True,
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
