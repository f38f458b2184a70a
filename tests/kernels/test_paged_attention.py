"""paged_attention_v1/v2 and xl_paged_attention_v1/v2 against the fp32 reference.

The paged caches are written here by a plain-torch per-token writer (not by the cache family's
ops), into caches poisoned with NaN, with shuffled block tables whose unused entries point far
outside the cache: a kernel that reads a slot or a block it should not will fail."""

import functools
import importlib
import math
import re

import pytest
import torch
import torch.nn.functional as F
from narrowed import skip_left_out

import aphrodite_ext
from aphrodite_ext.ops.paged_attention import (
    LONG_PARTITION_SIZE,
    LONG_SEQ_LEN,
    MIN_PARTITION_SIZE,
    PARTITION_SIZE,
    paged_attention_ref,
    split_kv,
    v2_scratch,
)
from aphrodite_ext.ops.paged_attention import paged_attention as _paged_attention
from aphrodite_ext.ops.paged_attention import xl_paged_attention as _xl_paged_attention

# The module itself (aphrodite_ext.ops.paged_attention, as an attribute, is the function).
_ops_module = importlib.import_module("aphrodite_ext.ops.paged_attention")

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
HEAD_SIZES = [64, 80, 96, 112, 128, 192, 256]
BLOCK_SIZES = [8, 16, 32]
# (num_heads, num_kv_heads): MHA, GQA 4, GQA 8, MQA, and a group of 17 (more query heads than
# one thread block of the tensor-core kernel serves: 16 and 1).
GROUPS = [(4, 4), (8, 2), (16, 2), (6, 1), (34, 2)]
# Lengths of one batch: a single token, an empty sequence, not multiples of any block size,
# more than one v2 partition.
SEQ_LENS = [1, 0, 7, 83, 517, 1100]
UNUSED_BLOCK = 2**30  # the unused tail of each block table: never a valid block


def _skip_left_out(fn):
    """fn, skipping the test where a build narrowed by generator options left out the head
    size, block size, dtype or cache the call needs (a default build never says so: there it
    fails). Wraps a call or a whole test (opcheck reports the op's error as its own)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with skip_left_out():
            return fn(*args, **kwargs)

    return call


paged_attention = _skip_left_out(_paged_attention)
xl_paged_attention = _skip_left_out(_xl_paged_attention)


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_C")


def fp8_bytes(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale as E4M3 bytes (torch's own rounding, independent of the kernels)."""
    return (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


class Batch:
    """Random keys and values for each sequence, written into fresh paged caches."""

    def __init__(
        self,
        seq_lens,
        num_heads,
        num_kv_heads,
        head_size,
        block_size,
        dtype,
        device,
        kv_cache_dtype="auto",
        spare_blocks=5,
        spare_columns=3,
        padded_heads=0,
    ):
        self.seq_lens_list = list(seq_lens)
        self.max_seq_len = max(1, max(seq_lens))
        self.num_kv_heads, self.block_size = num_kv_heads, block_size
        self.kv_cache_dtype = kv_cache_dtype
        self.k_scale, self.v_scale = (0.03, 0.02) if kv_cache_dtype != "auto" else (1.0, 1.0)
        n = len(seq_lens)
        blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
        num_blocks = sum(blocks_per_seq) + spare_blocks
        cache_dtype = torch.uint8 if kv_cache_dtype != "auto" else dtype
        x = 16 // torch.empty((), dtype=cache_dtype).element_size()
        # The caches, NaN everywhere nothing is written (0x7f is an E4M3 NaN). padded_heads
        # makes the block stride larger than num_kv_heads * head_size * block_size.
        kv_alloc = num_kv_heads + padded_heads
        kshape = (num_blocks, kv_alloc, head_size // x, block_size, x)
        vshape = (num_blocks, kv_alloc, head_size, block_size)
        nan = 0x7F if kv_cache_dtype != "auto" else float("nan")
        self.key_cache = torch.full(kshape, nan, dtype=cache_dtype, device=device)
        self.value_cache = torch.full(vshape, nan, dtype=cache_dtype, device=device)
        self.key_cache = self.key_cache[:, :num_kv_heads]
        self.value_cache = self.value_cache[:, :num_kv_heads]
        # Shuffled block tables; unused entries hold an id far outside the cache.
        order = torch.randperm(num_blocks)
        cols = max(blocks_per_seq) + spare_columns
        table = torch.full((n, cols), UNUSED_BLOCK, dtype=torch.int32)
        used = 0
        for s, nb in enumerate(blocks_per_seq):
            table[s, :nb] = order[used : used + nb].int()
            used += nb
        self.block_tables = table.to(device)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        self.keys, self.values = [], []
        for s, length in enumerate(seq_lens):
            k = torch.randn(length, num_kv_heads, head_size, device=device).to(dtype)
            v = torch.randn(length, num_kv_heads, head_size, device=device).to(dtype)
            self.keys.append(k)
            self.values.append(v)
            self._write(table[s], k, v, x)
        self.query = torch.randn(n, num_heads, head_size, device=device).to(dtype)
        self.scale = head_size**-0.5

    def _write(self, table_row, k, v, x):
        """Token j of the sequence goes to block table_row[j // block_size], slot j % block_size;
        within the key block, element d of a head lives at [d // x, slot, d % x]."""
        length, num_kv_heads, head_size = k.shape
        if length == 0:
            return
        j = torch.arange(length)
        blocks = table_row[j // self.block_size].long().to(k.device)
        slots = (j % self.block_size).to(k.device)
        if self.kv_cache_dtype != "auto":
            k, v = fp8_bytes(k, self.k_scale), fp8_bytes(v, self.v_scale)
        self.key_cache[blocks, :, :, slots, :] = k.reshape(length, num_kv_heads, head_size // x, x)
        self.value_cache[blocks, :, :, slots] = v

    def ref(self, alibi_slopes=None, pos_bias_u=None, matrix_bd=None):
        return paged_attention_ref(
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.scale,
            alibi_slopes,
            self.kv_cache_dtype,
            self.k_scale,
            self.v_scale,
            pos_bias_u,
            matrix_bd,
        )

    def _cache_args(self):
        """The ops' arguments from key_cache to scale."""
        return (
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.max_seq_len,
            self.scale,
        )

    def run(self, version, alibi_slopes=None, query=None, out=None):
        query = self.query if query is None else query
        out = torch.full_like(self.query, float("nan")) if out is None else out
        return paged_attention(
            query,
            *self._cache_args(),
            alibi_slopes,
            self.kv_cache_dtype,
            self.k_scale,
            self.v_scale,
            out=out,
            version=version,
        )

    def run_xl(self, pos_bias_u, matrix_bd, version="auto"):
        out = torch.full_like(self.query, float("nan"))
        return xl_paged_attention(
            self.query,
            pos_bias_u,
            matrix_bd,
            *self._cache_args(),
            self.kv_cache_dtype,
            self.k_scale,
            self.v_scale,
            out=out,
            version=version,
        )


def check(out, ref, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_reference_matches_sdpa(device):
    """The reference (gathering from the paged cache) against SDPA on the unpaged tensors."""
    b = Batch([5, 40, 33], 8, 2, 64, 16, torch.float32, device)
    ref = b.ref()
    for s in range(len(b.seq_lens_list)):
        k = b.keys[s].repeat_interleave(4, dim=1).transpose(0, 1)  # [heads, n, d]
        v = b.values[s].repeat_interleave(4, dim=1).transpose(0, 1)
        q = b.query[s][:, None, :]  # [heads, 1, d]
        expected = F.scaled_dot_product_attention(q, k, v, scale=b.scale)[:, 0]
        torch.testing.assert_close(ref[s], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_head_sizes(device, version, dtype, head_size):
    b = Batch(SEQ_LENS, 8, 2, head_size, 16, dtype, device)
    check(b.run(version), b.ref(), dtype)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_block_sizes_and_groups(device, version, groups, block_size):
    dtype = torch.bfloat16
    b = Batch(SEQ_LENS, *groups, 128, block_size, dtype, device)
    check(b.run(version), b.ref(), dtype)


def test_empty_sequences_give_zeros(device):
    b = Batch([0, 3, 0], 4, 4, 64, 8, torch.float16, device)
    for version in ["v1", "v2"]:
        out = b.run(version)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.equal(out[2], torch.zeros_like(out[2]))
        check(out, b.ref(), torch.float16)


@pytest.mark.parametrize("dtype", list(TOL))
def test_long_sequence_v1_equals_v2(device, dtype):
    b = Batch([5000, 1, 1536], 8, 2, 128, 16, dtype, device)
    ref = b.ref()
    v1, v2 = b.run("v1"), b.run("v2")
    check(v1, ref, dtype)
    check(v2, ref, dtype)
    check(v1, v2, dtype)


def test_very_long_sequence_v2(device):
    if device == "cpu":
        pytest.skip("65536 tokens: GPU only (the reference is slow on the CPU)")
    b = Batch([65536, 3], 8, 1, 128, 16, torch.bfloat16, device)
    check(b.run("v2"), b.ref(), torch.bfloat16)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grids_over_and_under_the_sms(device, version, dtype):
    """Plain and XL attention, v1 and v2, over grids of at most a block an SM (which a launch
    with PDL keeps to one block an SM: launch.cuh; on an H100 or H200 their blocks are wide) of
    one and of three long sequences, one of them empty, and over one of more (sequence, KV
    head) blocks than the GPU has SMs (4 warps), of random lengths."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device != "cpu" else 8
    gen = torch.Generator().manual_seed(sms)
    kv = 8
    fill = max(1, sms // (3 * kv))  # the most partitions of three sequences within the SMs
    for num_seqs in (1, 3, sms // kv + 1):
        # v2's floor of ceil(length / 512) partitions stays within fill.
        lengths = torch.randint(256 * fill + 100, 512 * fill - 100, (num_seqs,), generator=gen)
        lengths = lengths.tolist()
        if num_seqs > 1:
            lengths[1] = 0
        if device != "cpu" and sms >= 6 * kv:  # the grids this test is for (a GPU this size)
            longest = max(lengths)
            size = split_kv(version, longest, num_seqs, 4 * kv, kv, 16, torch.device(device))
            grid = num_seqs * kv * (math.ceil(longest / size) if size else 1)
            assert (grid <= sms) == (num_seqs <= 3), (grid, size)
        b = Batch(lengths, 4 * kv, kv, 128, 16, dtype, device)
        check(b.run(version), b.ref(), dtype)
        u = torch.randn_like(b.query)
        bd = torch.randn(num_seqs, 4 * kv, b.max_seq_len, device=device).to(dtype)
        check(b.run_xl(u, bd, version), b.ref(pos_bias_u=u, matrix_bd=bd), dtype)


def _mma_warps(fn, *args, **kwargs) -> list[int]:
    """The warps of each tensor-core kernel fn(*args, **kwargs) launches (its last template
    argument, in the names torch.profiler reads from CUPTI)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    warps = []
    for name in names:
        if "paged_attention_mma_kernel" in name:
            found = re.search(r"paged_attention_mma_kernel<[^()]*?(\d+)\s*>", name)
            assert found, f"no warp count in the kernel's name: {name}"
            warps.append(int(found[1]))
    assert names, "the profiler saw no kernel"
    return warps


@pytest.mark.parametrize("xl", [False, True])
@pytest.mark.parametrize("head_size, block_size", [(64, 16), (128, 8), (128, 16), (128, 32),
                                                   (192, 32), (256, 16), (256, 32)])  # fmt: skip
def test_wide_blocks_where_split_kv_counts_on_them(device, head_size, block_size, xl):
    """split_kv's cost model counts on wide (8-warp) blocks exactly where the launcher runs them
    (_mma_wide, with the op's answer of which blocks fit, against paged_attention_launch.cuh's
    mma_wide and its shared-memory tests): v1 and v2 grids within the SMs and past them,
    partitions with and without a step for each warp, one longer than its sequence (which the
    op clamps to whole steps: at block size 8 too), and head / block sizes whose blocks fit some
    GPUs' shared memory and not others' (a wide block at 256 / 32 fits none). Where a 4-warp
    block does not fit either, the staged kernel runs. The profiler names the kernel each call
    launched; the outputs are checked."""
    if device == "cpu":
        pytest.skip("the tensor-core kernel is CUDA's")
    index = torch.device(device).index or torch.cuda.current_device()
    dtype = torch.bfloat16
    blocks = _ops_module._mma_warps(index, dtype, "auto", head_size, block_size, xl)
    options = aphrodite_ext.build_info()["families"]["paged_attention"].get("generator_options")
    if blocks == 0 and (
        torch.cuda.get_device_capability(index) < (8, 0) or any(
            o in (options or []) for o in ("kernel=staged", "kernel=regs", "xl=off")
        )
    ):  # fmt: skip
        pytest.skip(f"this build or GPU runs no tensor-core kernel here ({options})")
    sms = _ops_module._sm_count(index)
    step = max(16, block_size)
    kv = 8
    one = torch.ones(1, device=device)
    # (sequences, length, v2 partition size or 0 for v1)
    cases = [(1, 2048, 0), (2, 1000, 256), (3, 4096, 1024), (1, 200, 512), (1, 8 * step - 1, 0),
             (1, 300, 4 * step), (sms // kv + 1, 300, 0), (sms // kv // 2 + 1, 600, 256)]  # fmt: skip
    for num_seqs, length, partition in cases:
        b = Batch([length] * num_seqs, 4 * kv, kv, head_size, block_size, dtype, device)
        out = torch.full_like(b.query, float("nan"))
        u = torch.randn_like(b.query) if xl else None
        bd = torch.randn(num_seqs, 4 * kv, length, device=device).to(dtype) if xl else None
        args = [b.query, *([u, bd] if xl else []), b.key_cache, b.value_cache, kv, b.scale,
                b.block_tables, b.seq_lens, block_size, length, *([] if xl else [None]), "auto",
                one, one]  # fmt: skip
        name = "xl_paged_attention" if xl else "paged_attention"
        if partition:
            v2 = getattr(torch.ops._C, name + "_v2")
            scratch = v2_scratch(num_seqs, 4 * kv, head_size, length, device, partition)
            with skip_left_out():
                warps = _mma_warps(v2, out, *scratch, *args, partition_size=partition)
        else:
            v1 = getattr(torch.ops._C, name + "_v1")
            with skip_left_out():
                warps = _mma_warps(v1, out, *args)
        grid = num_seqs * kv * (math.ceil(length / partition) if partition else 1)
        tokens = min(partition, length) if partition else length
        wide = _ops_module._mma_wide(grid, tokens, step, sms, blocks == 8)
        expected = [8 if wide else 4] if blocks else []
        assert warps == expected, (num_seqs, length, partition, grid, blocks, warps)
        check(out, b.ref(pos_bias_u=u, matrix_bd=bd), dtype)
    optin = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)
    if optin >= 227 * 1024 and "wide=off" not in (options or []):
        # (sm_90, sm_100: every wide block fits but head 256's at block 32, which none builds)
        assert blocks == (4 if (head_size, block_size) == (256, 32) else 8), (optin, blocks)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", list(TOL))
def test_alibi(device, version, dtype):
    b = Batch(SEQ_LENS, 8, 4, 96, 16, dtype, device)
    slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(8)], device=device)
    check(b.run(version, alibi_slopes=slopes), b.ref(alibi_slopes=slopes), dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_fp8_cache(device, kv_cache_dtype, version, dtype, block_size):
    b = Batch(SEQ_LENS, 8, 2, 128, block_size, dtype, device, kv_cache_dtype=kv_cache_dtype)
    check(b.run(version), b.ref(), dtype)


def test_fp8_cache_as_float8_tensor(device):
    b = Batch([33, 600], 4, 2, 64, 16, torch.float16, device, kv_cache_dtype="fp8")
    ref = b.ref()
    b.key_cache = b.key_cache.view(torch.float8_e4m3fn)
    b.value_cache = b.value_cache.view(torch.float8_e4m3fn)
    check(b.run("v1"), ref, torch.float16)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_strided_query_and_cache(device, version):
    """query sliced out of a packed qkv tensor; caches whose block stride has spare heads."""
    dtype = torch.float16
    b = Batch(SEQ_LENS, 8, 2, 80, 16, dtype, device, padded_heads=3)
    qkv = torch.randn(len(SEQ_LENS), 8 + 2 * 2, 80, device=device).to(dtype)
    query = qkv[:, :8]
    b.query = query.clone()
    assert not query.is_contiguous()
    check(b.run(version, query=query), b.ref(), dtype)


@pytest.mark.parametrize("dtype", list(TOL))
def test_every_sequence_empty(device, dtype):
    # max_seq_len 0 (a batch whose sequences have no cached token yet): zeros, as an empty
    # sequence gets beside others, from v1, v2 (also with scratch of no partitions) and XL.
    b = Batch([0, 0, 0], 8, 2, 64, 16, dtype, device)
    b.max_seq_len = 0
    zeros = torch.zeros_like(b.query)
    for version in ("v1", "v2"):
        torch.testing.assert_close(b.run(version), zeros, atol=0, rtol=0)
        u, bd = torch.randn_like(b.query), torch.randn(3, 8, 0, device=device).to(dtype)
        torch.testing.assert_close(b.run_xl(u, bd, version), zeros, atol=0, rtol=0)
    out = torch.full_like(b.query, float("nan"))
    scratch = [torch.empty(3, 8, 0, device=device) for _ in range(2)]
    tmp_out = torch.empty(3, 8, 0, 64, device=device)
    one = torch.ones(1, device=device)
    caches = (b.query, b.key_cache, b.value_cache, 2, b.scale, b.block_tables, b.seq_lens, 16, 0)
    torch.ops._C.paged_attention_v2(out, *scratch, tmp_out, *caches, None, "auto", one, one)
    torch.testing.assert_close(out, zeros, atol=0, rtol=0)


@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", list(TOL))
def test_xl(device, version, dtype, head_size):
    seq_lens = [9, 1, 0, 700, 1300]
    b = Batch(seq_lens, 8, 2, head_size, 16, dtype, device)
    u = torch.randn_like(b.query)
    width = b.max_seq_len + 37  # wider than max_seq_len
    bd = torch.randn(len(seq_lens), 8, width, device=device).to(dtype)
    for s, length in enumerate(seq_lens):
        bd[s, :, length:] = float("nan")  # a sequence reads only its first seq_len entries
    check(b.run_xl(u, bd, version), b.ref(pos_bias_u=u, matrix_bd=bd), dtype)


@pytest.mark.parametrize("u_offset", [0, 1])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_xl_groups_and_strides(device, dtype, block_size, u_offset):
    # The tensor-core kernel's XL instantiation: a group of 17 query heads (two thread blocks
    # of a kv head, the second with one row), head size 128, every block size; pos_bias_u and
    # matrix_bd sliced out of wider tensors (u_offset 1: u's rows are not 16-byte aligned, so
    # q + u is read without the asynchronous copy), over both versions.
    seq_lens = [1, 47, 0, 1029, 16 * 4 * 3 + 5]
    b = Batch(seq_lens, 34, 2, 128, block_size, dtype, device)
    n = len(seq_lens)
    u = torch.randn(n, 34, 128 + 8, device=device).to(dtype)[:, :, u_offset : u_offset + 128]
    bd = torch.randn(n, 35, b.max_seq_len + 3, device=device).to(dtype)[:, 1:, 2:]
    for s, length in enumerate(seq_lens):
        bd[s, :, length:] = float("nan")  # a sequence reads only its first seq_len entries
    for version in ("v1", "v2"):
        check(b.run_xl(u, bd, version), b.ref(pos_bias_u=u, matrix_bd=bd), dtype)


@pytest.mark.parametrize("dtype", list(TOL))
def test_xl_scales_matrix_bd(device, dtype):
    # The score is scale * ((q + u) . k + matrix_bd), as in Transformer-XL: with u = 0 and
    # matrix_bd = q . k, XL attention is plain attention at twice the scale (a matrix_bd added
    # outside the scale would give scale + 1 times q . k instead).
    seq_lens = [5, 300, 33]
    b = Batch(seq_lens, 4, 2, 64, 16, dtype, device)
    bd = torch.zeros(len(seq_lens), 4, b.max_seq_len, device=device)
    for s, n in enumerate(seq_lens):
        k = b.keys[s].float().repeat_interleave(2, dim=1)  # [n, heads, head_size]
        bd[s, :, :n] = torch.einsum("hd,nhd->hn", b.query[s].float(), k)
    out = b.run_xl(torch.zeros_like(b.query), bd.to(dtype))
    b.scale *= 2
    check(out, b.ref(), dtype)


def test_xl_fp8(device):
    b = Batch([17, 530], 4, 1, 128, 32, torch.bfloat16, device, kv_cache_dtype="fp8")
    u = torch.randn_like(b.query)
    bd = torch.randn(2, 4, b.max_seq_len, device=device).to(torch.bfloat16)
    for version in ["v1", "v2"]:
        check(b.run_xl(u, bd, version), b.ref(pos_bias_u=u, matrix_bd=bd), torch.bfloat16)


# ------------------------------------------------------------------------------------------
# Bad inputs: each check of the binding, through the raw v1 op (v2 and XL share them).


def _v1_args(device):
    b = Batch([5, 20], 8, 2, 64, 16, torch.float16, device)
    one = torch.ones(1, device=device)
    return dict(
        out=torch.empty_like(b.query),
        query=b.query,
        key_cache=b.key_cache,
        value_cache=b.value_cache,
        num_kv_heads=2,
        scale=0.125,
        block_tables=b.block_tables,
        seq_lens=b.seq_lens,
        block_size=16,
        max_seq_len=20,
        alibi_slopes=None,
        kv_cache_dtype="auto",
        k_scale=one,
        v_scale=one,
    )


def _with(**changes):
    return lambda a: {**a, **{k: (f(a) if callable(f) else f) for k, f in changes.items()}}


BAD_V1 = [
    (_with(query=lambda a: a["query"][0]), r"query must be \[num_seqs, num_heads, head_size\]"),
    (_with(query=lambda a: a["query"].double()), "float32, float16 or bfloat16"),
    (_with(query=lambda a: a["query"][..., :48]), "head_size must be one of"),
    (_with(block_size=64), "block_size must be 8, 16 or 32"),
    (_with(num_kv_heads=3), r"must be a positive multiple of num_kv_heads \(3\)"),
    (
        _with(query=lambda a: a["query"][:, :0], out=lambda a: a["out"][:, :0]),
        r"num_heads \(0\) must be a positive multiple of num_kv_heads \(2\)",
    ),
    (_with(max_seq_len=-1), "max_seq_len must be >= 0"),
    (_with(scale=float("inf")), "scale must be finite"),
    (_with(out=lambda a: a["out"][:1]), "out must have the shape of query"),
    (_with(out=lambda a: a["out"].float()), "out must be"),
    (_with(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype must be"),
    (_with(key_cache=lambda a: a["key_cache"].float()), "key_cache must have the query's dtype"),
    (_with(kv_cache_dtype="fp8"), "key_cache must be uint8 or float8_e4m3fn"),
    (
        _with(key_cache=lambda a: a["key_cache"].reshape(a["key_cache"].shape[0], 2, 16, 16, 4)),
        r"key_cache must be \[num_blocks, num_kv_heads=2, head_size/x=8, block_size=16, x=8\]",
    ),
    (
        _with(value_cache=lambda a: a["value_cache"].transpose(2, 3)),
        r"value_cache must be \[num_blocks=",
    ),
    (_with(num_kv_heads=4), r"key_cache must be \[num_blocks, num_kv_heads=4"),
    (
        _with(key_cache=lambda a: a["key_cache"].transpose(3, 4).contiguous().transpose(3, 4)),
        "key_cache must be contiguous within each",
    ),
    (
        _with(value_cache=lambda a: a["value_cache"].transpose(2, 3).contiguous().transpose(2, 3)),
        "value_cache must be contiguous within each",
    ),
    (
        _with(key_cache=lambda a: torch.cat([a["key_cache"]] * 2, dim=1)[:, :2]),
        "same block and head strides",
    ),
    (_with(k_scale=lambda a: torch.ones(2, device=a["query"].device)), "k_scale must hold one"),
    (_with(v_scale=lambda a: a["v_scale"].half()), "v_scale must be"),
    (_with(block_tables=lambda a: a["block_tables"].long()), "block_tables must be"),
    (_with(block_tables=lambda a: a["block_tables"][0]), r"block_tables must be int32 \[num_seqs"),
    (_with(seq_lens=lambda a: a["seq_lens"].long()), "seq_lens must be"),
    (_with(seq_lens=lambda a: a["seq_lens"][:1]), r"seq_lens must be int32 \[num_seqs=2\]"),
    (
        _with(alibi_slopes=lambda a: torch.ones(4, device=a["query"].device)),
        r"alibi_slopes must be float32 \[num_heads=8\]",
    ),
    (
        _with(alibi_slopes=lambda a: torch.ones(8, device=a["query"].device).half()),
        "alibi_slopes must be",
    ),
]

BAD_V1_CPU_ONLY = [  # the CPU path reads the indices; the GPU path trusts them
    (_with(max_seq_len=19), r"seq_lens\[1\] = 20 is outside \[0, max_seq_len=19\]"),
    (
        _with(block_tables=lambda a: a["block_tables"][:, :1]),
        r"seq_lens\[1\] = 20 needs 2 blocks but block_tables has 1 columns",
    ),
    (
        _with(block_tables=lambda a: a["block_tables"].clone().fill_(-1)),
        r"block_tables\[0, 0\] = -1 is outside the cache",
    ),
]


@pytest.mark.parametrize("bad, match", BAD_V1 + BAD_V1_CPU_ONLY)
def test_rejects_bad_input(device, bad, match):
    if (bad, match) in BAD_V1_CPU_ONLY and device != "cpu":
        pytest.skip("index checks are CPU only")
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.paged_attention_v1(**bad(_v1_args(device)))


def test_rejects_other_device(device):
    if device == "cpu":
        pytest.skip("needs a second device")
    a = _v1_args(device)
    a["seq_lens"] = a["seq_lens"].cpu()
    with pytest.raises(RuntimeError, match="seq_lens is on cpu"):
        torch.ops._C.paged_attention_v1(**a)


@pytest.mark.parametrize(
    "sparse",
    [
        dict(blocksparse_local_blocks=2),
        dict(blocksparse_vert_stride=4),
        dict(blocksparse_head_sliding_step=1),
    ],
)
def test_rejects_block_sparse(device, sparse):
    with pytest.raises(RuntimeError, match="block-sparse attention is not supported"):
        torch.ops._C.paged_attention_v1(**_v1_args(device), tp_rank=0, **sparse)


def _v2_args(device, max_seq_len=600):
    a = _v1_args(device)
    a["max_seq_len"] = max_seq_len
    exp_sums, max_logits, tmp_out = v2_scratch(2, 8, 64, max_seq_len, device)
    return dict(out=a.pop("out"), exp_sums=exp_sums, max_logits=max_logits, tmp_out=tmp_out, **a)


@pytest.mark.parametrize(
    "bad, match",
    [
        (_with(tmp_out=lambda a: a["tmp_out"][:, :, :1]), r"needs ceil\(max_seq_len / 512\) = 2"),
        (_with(exp_sums=lambda a: a["exp_sums"][:, :, :1]), r"needs ceil\(max_seq_len / 512\)"),
        (_with(max_logits=lambda a: a["max_logits"].half()), "max_logits must be"),
        (_with(tmp_out=lambda a: a["tmp_out"][..., :32]), r"tmp_out must be float32 \[num_seqs"),
        (
            _with(max_logits=lambda a: torch.empty(2, 8, 3, device=a["query"].device)),
            "max_logits must have tmp_out's 2 partitions",
        ),
        (
            _with(tmp_out=lambda a: a["tmp_out"].transpose(0, 1).contiguous().transpose(0, 1)),
            "tmp_out must be contiguous",
        ),
    ],
)
def test_rejects_bad_v2_scratch(device, bad, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.paged_attention_v2(**bad(_v2_args(device)))


@_skip_left_out
def test_v2_accepts_extra_partitions(device):
    b = Batch([700, 3], 8, 2, 64, 16, torch.float32, device)
    a = _v2_args(device, b.max_seq_len)
    a.update(
        query=b.query,
        key_cache=b.key_cache,
        value_cache=b.value_cache,
        block_tables=b.block_tables,
        seq_lens=b.seq_lens,
        scale=b.scale,
    )
    exp_sums, max_logits, tmp_out = v2_scratch(2, 8, 64, 5 * PARTITION_SIZE, device)
    a.update(exp_sums=exp_sums, max_logits=max_logits, tmp_out=tmp_out)
    a["out"] = torch.full_like(b.query, float("nan"))
    torch.ops._C.paged_attention_v2(**a)
    check(a["out"], b.ref(), torch.float32)


@_skip_left_out
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_v2_partition_sizes(device, block_size, dtype):
    """v2 in partitions of any multiple of the block size, with a scratch of exactly the
    partitions that takes and with a larger one: one block, odd multiples (at block size 8, not
    whole steps of the tensor-core kernel, which leaves them to the staged one), 512, past the
    longest sequence (one partition) and far past it (2^31 tokens: taken as one partition)."""
    b = Batch([1100, 517, 7, 0, 83], 8, 2, 64, block_size, dtype, device)
    ref = b.ref()
    one = torch.ones(1, device=device)
    for partition in sorted({block_size, 3 * block_size, 17 * block_size, 64, 512, 1120, 2**31}):
        for extra in (0, 3):
            size = min(partition, 1120)  # the scratch of a partition past the sequences: one
            scratch = v2_scratch(5, 8, 64, b.max_seq_len + extra * size, device, size)
            out = torch.full_like(b.query, float("nan"))
            torch.ops._C.paged_attention_v2(
                out, *scratch, b.query, b.key_cache, b.value_cache, 2, b.scale, b.block_tables,
                b.seq_lens, block_size, b.max_seq_len, None, "auto", one, one,
                partition_size=partition,
            )  # fmt: skip
            check(out, ref, dtype)
    # The XL op takes the same argument.
    u = torch.randn_like(b.query)
    bd = torch.randn(5, 8, b.max_seq_len, device=device).to(dtype)
    scratch = v2_scratch(5, 8, 64, b.max_seq_len, device, 3 * block_size)
    out = torch.full_like(b.query, float("nan"))
    torch.ops._C.xl_paged_attention_v2(
        out, *scratch, b.query, u, bd, b.key_cache, b.value_cache, 2, b.scale, b.block_tables,
        b.seq_lens, block_size, b.max_seq_len, "auto", one, one, partition_size=3 * block_size,
    )  # fmt: skip
    check(out, b.ref(pos_bias_u=u, matrix_bd=bd), dtype)


def test_rejects_scratch_past_int32_tokens(device):
    """A scratch of 2^15 partitions of 2^16 tokens: 2^31 tokens, past the kernels' 32-bit
    token indices."""
    a = _v2_args(device, max_seq_len=2**16)
    scratch = v2_scratch(2, 8, 64, 2**31, device, 2**16)
    a.update(exp_sums=scratch[0], max_logits=scratch[1], tmp_out=scratch[2])
    with pytest.raises(RuntimeError, match=r"32768 partitions of 65536 tokens pass 2\^31 tokens"):
        torch.ops._C.paged_attention_v2(**a, partition_size=2**16)


@pytest.mark.parametrize(
    "partition, match",
    [
        (0, r"partition_size must be a positive multiple of block_size \(16\), got 0"),
        (-16, "got -16"),
        (24, "got 24"),
        (64, r"holds 2 partitions but max_seq_len=600 needs ceil\(max_seq_len / 64\) = 10"),
    ],
)
def test_rejects_bad_partition_size(device, partition, match):
    a = _v2_args(device)
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.paged_attention_v2(**a, partition_size=partition)


def test_split_kv(monkeypatch):
    """split_kv's rule, on a GPU of 132 SMs (faked: no GPU needed) and on the CPU, over random
    problems: v1 where asked; else partitions of whole steps. The tensor-core kernel's (16 heads
    a block): partitions of a power of two tokens, at most as many as keep the grid within one
    block an SM, or within 3/4 of the SMs at MIN_PARTITION_SIZE tokens each, but at least
    ceil(length / LONG_PARTITION_SIZE) past LONG_SEQ_LEN ("v2": and ceil(length /
    PARTITION_SIZE)); "auto" is v1 where that split is one partition. The staged kernel's (8
    heads a block): v1 ("auto", up to LONG_SEQ_LEN tokens) where the blocks of v1 fill half the
    SMs, else at most PARTITION_SIZE tokens, as many partitions as keep the grid within one block
    an SM while each holds MIN_PARTITION_SIZE tokens. Then the splits the cost model picks for
    problems measured on an H100 and an H200."""
    # (aphrodite_ext.ops.paged_attention is also the name of the function ops exports)
    module = importlib.import_module("aphrodite_ext.ops.paged_attention")
    monkeypatch.setattr(module, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.version, "hip", None)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    with pytest.raises(ValueError, match="version must be"):
        split_kv("v3", 100, 1, 8, 8, 16, gpu)
    gen = torch.Generator().manual_seed(0)

    def draw(low, high):
        return int(torch.randint(low, high, (1,), generator=gen))

    for _ in range(1000):
        length, seqs, kv, block = draw(1, 70000), draw(1, 300), draw(1, 17), 8 << draw(0, 3)
        heads, warps = kv * draw(1, 41), (0, 4, 8)[draw(0, 3)]
        per_block = 16 if warps else 8
        head_size = (64, 80, 128, 256)[draw(0, 4)]
        blocks = seqs * kv * math.ceil(heads // kv / per_block)
        call = functools.partial(split_kv, max_seq_len=length, num_seqs=seqs, num_heads=heads,
                                 num_kv_heads=kv, block_size=block)  # fmt: skip
        assert call("v1", device=gpu, mma_warps=warps) == 0
        assert call("v1", device=cpu) == 0
        assert call("v2", device=cpu) == PARTITION_SIZE
        vllm = length > 8192 or (length > PARTITION_SIZE and seqs * heads < 512)
        assert call("auto", device=cpu) == (PARTITION_SIZE if vllm else 0)
        size = call("v2", device=gpu, mma_warps=warps, head_size=head_size)
        auto = call("auto", device=gpu, mma_warps=warps, head_size=head_size)
        step = max(16, block)
        assert size % step == 0 and size >= step
        parts = math.ceil(length / size)  # the partitions the longest sequence takes
        problem = (length, seqs, kv, heads, block, warps, head_size, size)
        if per_block == 16:
            long = math.ceil(length / LONG_PARTITION_SIZE) if length > LONG_SEQ_LEN else 1
            most = max(
                min(99 // blocks, math.ceil(length / MIN_PARTITION_SIZE)), 132 // blocks, long, 1
            )
            least_v2 = max(long, math.ceil(length / PARTITION_SIZE))
            assert size >= MIN_PARTITION_SIZE and size & (size - 1) == 0, problem
            assert size == MIN_PARTITION_SIZE or math.ceil(length / (size // 2)) > max(
                most, least_v2
            ), problem  # the least power of two for its partitions
            assert least_v2 <= parts <= max(most, least_v2), problem
            if auto == 0:  # v2's split is then its floor alone
                assert length <= LONG_SEQ_LEN, problem
            else:
                assert auto < length and size <= auto, problem
                assert long <= math.ceil(length / auto) <= most, problem
            continue
        assert step <= size <= PARTITION_SIZE
        assert math.ceil(length / PARTITION_SIZE) <= parts
        assert parts <= max(
            math.ceil(length / PARTITION_SIZE), math.ceil(length / MIN_PARTITION_SIZE)
        )
        if parts > math.ceil(length / PARTITION_SIZE):
            assert blocks * parts <= 132
        # One more partition: past one block an SM, under MIN_PARTITION_SIZE tokens, or (whole
        # steps) the same size.
        more = step * math.ceil(math.ceil(length / (parts + 1)) / step)
        assert (
            blocks * (parts + 1) > 132 or length / (parts + 1) < MIN_PARTITION_SIZE or more == size
        ), problem
        v1 = length <= LONG_SEQ_LEN and (length <= PARTITION_SIZE or blocks * 2 > 132)
        assert auto == (0 if v1 else size)
    # The tensor-core kernel, GQA 32/8, head 128, block 16, as (sequences, tokens): the rule's
    # partition size (0: v1) for problems of the H100 and H200 probes (kernels/attention/
    # NOTES.md). Measured, these ran at 0.88-1.00 of the fastest split's speed; the farthest:
    # 8 x 2048 on the H100 (0.88; v1 was faster there, this split on the H200), 12 x 4096 on the
    # H100 (0.91; wide blocks, which the H200 ran 1.3x faster) and 6 x 1024 on the H200 (0.92).
    picks = {
        (1, 1024): 128, (2, 1024): 128, (3, 1024): 256, (4, 1024): 256, (6, 1024): 0,
        (8, 1024): 0, (12, 1024): 0, (8, 2048): 1024, (1, 4096): 256, (3, 4096): 1024,
        (6, 4096): 2048, (12, 4096): 0, (32, 4096): 0, (1, 65536): 4096, (32, 16384): 4096,
    }  # fmt: skip
    for (seqs, length), size in picks.items():
        assert split_kv("auto", length, seqs, 32, 8, 16, gpu) == size, (seqs, length)
    # "v2" compares its options after its floor (here 2 partitions): v1, the cheapest before it,
    # would become 512-token partitions, where 256 cost less (wide blocks, 87 of them).
    assert split_kv("v2", 689, 29, 1, 1, 16, gpu, head_size=64) == 256
    # Where wide blocks cannot run (a build with paged_attention.wide=off, or an A100's 163 KiB
    # at head 128, block 16), 6 x 1024 takes two partitions of 4-warp blocks instead of v1 in
    # wide ones.
    for block in (16, 32):
        assert split_kv("auto", 1024, 6, 32, 8, block, gpu, mma_warps=4) == 512
    # The staged kernel (8 heads a block), 600 tokens, 8 blocks: 16 partitions would fit the
    # SMs, MIN_PARTITION_SIZE allows 10.
    assert split_kv("v2", 600, 1, 8, 8, 16, gpu, mma_warps=0) == 64
    with pytest.raises(ValueError, match="mma_warps must be 0, 4 or 8"):
        split_kv("auto", 600, 1, 8, 8, 16, gpu, mma_warps=16)  # (a count of heads, not warps)


class _OnGpu0(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0 (what partition_for reads of its inputs)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_partition_for_asks_of_the_calls_own_problem(monkeypatch):
    """partition_for (the wrappers' split) asks _mma_warps of the call's GPU, dtype, cache
    dtype, head size, block size and XL-ness, and splits by the answer: 0 as the staged
    kernel's 8 heads a block, 4 and 8 as the tensor-core kernel's. It asks nothing for "v1",
    for fp8 caches (the staged kernel's), on ROCm or off the GPU. (Faked GPU: runs without
    one.)"""
    module = _ops_module
    monkeypatch.setattr(module, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.version, "hip", None)
    asked, answer = [], {}
    monkeypatch.setattr(module, "_mma_warps", lambda *a: asked.append(a) or answer["warps"])
    gen = torch.Generator().manual_seed(7)

    def pick(options):
        return options[int(torch.randint(0, len(options), (1,), generator=gen))]

    for _ in range(300):
        seqs, kv, group = pick(range(1, 40)), pick((1, 2, 8)), pick((1, 4, 8))
        heads, head, block = kv * group, pick((64, 80, 128, 256)), pick((8, 16, 32))
        length, dtype = pick(range(1, 20000)), pick((torch.float16, torch.bfloat16))
        cache, xl, version = (
            pick(("auto", "auto", "fp8")),
            pick((False, True)),
            pick(("auto", "v2")),
        )
        answer["warps"] = pick((0, 4, 8))
        query = torch.empty(seqs, heads, head, dtype=dtype).as_subclass(_OnGpu0)
        key_cache = torch.empty(1, kv, head // 8, block, 8)
        value_cache = torch.empty(1, kv, head, block)
        asked.clear()
        got = module.partition_for(query, key_cache, value_cache, length, cache, version, xl)
        fp8 = cache == "fp8"  # (never the tensor-core kernel: nothing to ask)
        assert asked == ([] if fp8 else [(0, dtype, cache, head, block, xl)]), asked
        gpu = torch.device("cuda", 0)
        expected = split_kv(
            version, length, seqs, heads, kv, block, gpu, mma_warps=0 if fp8 else answer["warps"],
            head_size=head,
        )  # fmt: skip
        assert got == expected, (seqs, heads, kv, head, block, length, answer, got, expected)
        asked.clear()
        assert module.partition_for(query, key_cache, value_cache, length, cache, "v1", xl) == 0
        assert asked == []
    # The head size counts (auto, 1 sequence of 389 tokens, 1/1 heads, block 8, 4-warp blocks:
    # 64-token partitions at head 128, v1 at head 64).
    answer["warps"] = 4
    for head, size in ((128, 64), (64, 0)):
        query = torch.empty(1, 1, head, dtype=torch.float16).as_subclass(_OnGpu0)
        caches = torch.empty(1, 1, head // 8, 8, 8), torch.empty(1, 1, head, 8)
        assert module.partition_for(query, *caches, 389) == size, head
    # Off the GPU nothing is asked (vLLM's rule).
    asked.clear()
    assert module.partition_for(torch.empty(1, 1, 64), *caches, 389) == 0 and asked == []
    # The answers split differently: 6 sequences of 1024 tokens, GQA 32/8, head 128 (two
    # partitions of 48 staged blocks each, two of 4-warp ones, v1 in wide ones).
    query = torch.empty(6, 32, 128, dtype=torch.bfloat16).as_subclass(_OnGpu0)
    key_cache, value_cache = torch.empty(1, 8, 16, 16, 8), torch.empty(1, 8, 128, 16)
    splits = []
    for warps in (0, 4, 8):
        answer["warps"] = warps
        splits.append(module.partition_for(query, key_cache, value_cache, 1024))
    assert splits == [512, 512, 0], splits
    asked.clear()
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm: vLLM's rule, nothing asked
    assert module.partition_for(query, key_cache, value_cache, 1024) == PARTITION_SIZE
    assert asked == []


def test_the_launcher_says_which_blocks_run(device, monkeypatch):
    """_paged_attention_mma_warps, split_kv's question to the launcher: 8, 4 or 0 (the staged
    kernel) warps of the tensor-core kernel's blocks. None for fp32 queries or fp8 caches, nor
    on the CPU backend; on an sm_90 / sm_100 GPU 4-warp blocks for head 256 at block 32 and wide
    ones elsewhere (the default build); a bad cache dtype is refused. partition_for asks it of
    the call's own problem (XL or not) and splits by the answer."""
    ask = torch.ops._C._paged_attention_mma_warps
    index = 0 if device == "cpu" else torch.device(device).index or torch.cuda.current_device()
    with pytest.raises(RuntimeError, match="kv_cache_dtype must be"):
        ask(index, torch.bfloat16, "fp9", 128, 16, False)
    assert ask(index, torch.float32, "auto", 128, 16, False) == 0
    assert ask(index, torch.bfloat16, "fp8", 128, 16, False) == 0
    if device == "cpu":
        assert ask(index, torch.bfloat16, "auto", 128, 16, False) == 0
        return
    with pytest.raises(RuntimeError, match="no GPU"):
        ask(torch.cuda.device_count(), torch.bfloat16, "auto", 128, 16, False)
    options = aphrodite_ext.build_info()["families"]["paged_attention"].get("generator_options")
    optin = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", 0)
    default = not any(o.split("=")[0] in ("kernel", "wide", "xl", "dtypes", "head_sizes",
                                           "block_sizes") for o in options or [])  # fmt: skip
    gen = torch.Generator().manual_seed(index)
    asked, real = [], _ops_module._mma_warps

    def recorded(*args):
        asked.append(args)
        return real(*args)

    for head_size, block_size in [(64, 8), (128, 16), (192, 32), (256, 16), (256, 32)]:
        for xl in (False, True):
            warps = ask(index, torch.bfloat16, "auto", head_size, block_size, xl)
            if default and optin >= 227 * 1024:
                assert warps == (4 if (head_size, block_size) == (256, 32) else 8), (
                    head_size,
                    block_size,
                )
            assert warps in (0, 4, 8)
            if warps == 0:
                continue
            seqs, length = int(torch.randint(1, 40, (1,), generator=gen)), 1000
            b = Batch([length] * seqs, 32, 8, head_size, block_size, torch.bfloat16, device)
            expected = split_kv(
                "auto", length, seqs, 32, 8, block_size, b.query.device, mma_warps=warps,
                head_size=head_size,
            )  # fmt: skip
            asked.clear()
            with monkeypatch.context() as m:
                m.setattr(_ops_module, "_mma_warps", recorded)
                got = _ops_module.partition_for(
                    b.query, b.key_cache, b.value_cache, length, "auto", "auto", xl
                )
            assert asked == [(index, torch.bfloat16, "auto", head_size, block_size, xl)], asked
            assert got == expected, (head_size, block_size, xl, seqs)


def _xl_args(device):
    a = _v1_args(device)
    a.pop("alibi_slopes")
    q = a["query"]
    return dict(
        out=a.pop("out"),
        query=a.pop("query"),
        pos_bias_u=torch.randn_like(q),
        matrix_bd=torch.randn(2, 8, 20, device=device).half(),
        **a,
    )


@pytest.mark.parametrize(
    "bad, match",
    [
        (_with(pos_bias_u=lambda a: a["pos_bias_u"][:, :4]), "pos_bias_u must have the shape"),
        (_with(pos_bias_u=lambda a: a["pos_bias_u"].float()), "pos_bias_u must be"),
        (
            _with(matrix_bd=lambda a: a["matrix_bd"][..., :19]),
            r"matrix_bd must be \[num_seqs=2, num_heads=8, >= max_seq_len=20\]",
        ),
        (_with(matrix_bd=lambda a: a["matrix_bd"].float()), "matrix_bd must be"),
        (
            _with(matrix_bd=lambda a: a["matrix_bd"].transpose(1, 2).contiguous().transpose(1, 2)),
            "matrix_bd must be contiguous in its last dimension",
        ),
    ],
)
def test_xl_rejects_bad_input(device, bad, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.xl_paged_attention_v1(**bad(_xl_args(device)))


# ------------------------------------------------------------------------------------------
# Registration: opcheck and torch.compile.


@_skip_left_out
def test_opcheck(device):
    a = _v1_args(device)
    slopes = torch.rand(8, device=device)
    torch.library.opcheck(
        torch.ops._C.paged_attention_v1.default, (), {**a, "alibi_slopes": slopes}
    )
    torch.library.opcheck(torch.ops._C.paged_attention_v2.default, (), _v2_args(device))
    x = _xl_args(device)
    torch.library.opcheck(torch.ops._C.xl_paged_attention_v1.default, (), x)
    out = x.pop("out")
    exp_sums, max_logits, tmp_out = v2_scratch(2, 8, 64, 20, device)
    torch.library.opcheck(
        torch.ops._C.xl_paged_attention_v2.default,
        (),
        dict(out=out, exp_sums=exp_sums, max_logits=max_logits, tmp_out=tmp_out, **x),
    )


def test_torch_compile(device):
    b = Batch([37, 600, 5], 8, 2, 128, 16, torch.bfloat16, device)
    one = torch.ones(1, device=device)

    def f(query, key_cache, value_cache, block_tables, seq_lens):
        out = torch.empty_like(query)
        torch.ops._C.paged_attention_v1(
            out, query, key_cache, value_cache, 2, b.scale, block_tables, seq_lens, 16,
            b.max_seq_len, None, "auto", one, one,
        )  # fmt: skip
        return out * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(b.query, b.key_cache, b.value_cache, b.block_tables, b.seq_lens)
    check(out, b.ref() * 2, torch.bfloat16)
