"""reshape_and_cache (paged and flash layouts), copy_blocks and swap_blocks against plain-torch
references. Caches are filled with random bits (NaNs included) first, and every element of them
is compared afterwards: the targeted slots must hold the inputs, every other one its old bits."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.cache import (
    copy_blocks_ref,
    from_cache_ref,
    gather_ref,
    paged_key_chunk,
    reshape_and_cache_ref,
    swap_blocks_ref,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp8 round trip: e4m3 keeps 3 mantissa bits (half an ulp: 2^-4 relative); values below the
# smallest normal (2^-6 * scale) are multiples of 2^-9 * scale.
FP8_TOL = {"rtol": 2.0**-4, "atol": 2.0**-10}
BLOCK_SIZES = [8, 16, 32]
HEAD_SIZES = [64, 80, 128, 256]
TOKENS = [7, 83]
NUM_KV_HEADS = 3


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_C")


def poisoned(shape, dtype, device):
    """A tensor of random bits (for float dtypes: random values and some NaNs)."""
    if dtype in (torch.uint8, torch.float8_e4m3fn):
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=device).view(dtype)
    t = torch.randn(shape, dtype=dtype, device=device)
    t.view(-1)[::7] = float("nan")
    return t


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def assert_bits_equal(actual, expected):
    assert actual.shape == expected.shape
    diff = (bits(actual) != bits(expected)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[:4].tolist()}"


def fused_kv(tokens, heads, head_size, dtype, device):
    """key and value [tokens, heads, head_size] as slices of a fused qkv projection."""
    num_q = 2 * heads
    qkv = torch.randn(tokens, (num_q + 2 * heads) * head_size, dtype=dtype, device=device)
    key = qkv[:, num_q * head_size : (num_q + heads) * head_size].view(tokens, heads, head_size)
    value = qkv[:, (num_q + heads) * head_size :].view(tokens, heads, head_size)
    # (A single token's view reports its own strides: nothing to check.)
    assert tokens == 1 or (key.stride(0) == qkv.stride(0) and not key.is_contiguous())
    return key, value


def make_slots(tokens, num_blocks, block_size, device, pattern):
    """int64 slots: consecutive from a random block (prefill), or random distinct slots; every
    fifth token is padding (-1)."""
    if pattern == "consecutive":
        start = int(torch.randint(0, num_blocks * block_size - tokens + 1, ())) // 3 * 3
        slots = torch.arange(start, start + tokens)
    elif pattern == "runs":
        # Prefill through shuffled blocks: long runs of consecutive slots, the first starting
        # mid-block; one padding token in the middle (the ends of runs fall everywhere).
        slots = torch.arange(3, 3 + tokens)
        slots = torch.randperm(num_blocks)[slots // block_size] * block_size + slots % block_size
        slots[tokens // 2] = -1
        return slots.to(device)
    else:
        slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[2::5] = -1
    return slots.to(device)


def paged_caches(num_blocks, heads, head_size, block_size, cache_dtype, device):
    x = paged_key_chunk(cache_dtype)
    key_cache = poisoned((num_blocks, heads, head_size // x, block_size, x), cache_dtype, device)
    value_cache = poisoned((num_blocks, heads, head_size, block_size), cache_dtype, device)
    return key_cache, value_cache


def flash_caches(num_blocks, heads, head_size, block_size, cache_dtype, device):
    """Views of one combined [num_blocks, 2, block_size, heads, head_size] tensor."""
    kv = poisoned((num_blocks, 2, block_size, heads, head_size), cache_dtype, device)
    return kv[:, 0], kv[:, 1]


def run_and_check(
    device,
    dtype,
    block_size,
    head_size,
    tokens,
    flash,
    pattern,
    cache_dtype=None,
    kv_cache_dtype="auto",
):
    cache_dtype = cache_dtype or dtype
    num_blocks = (tokens + block_size - 1) // block_size + 3
    key, value = fused_kv(tokens, NUM_KV_HEADS, head_size, dtype, device)
    slots = make_slots(tokens, num_blocks, block_size, device, pattern)
    make = flash_caches if flash else paged_caches
    key_cache, value_cache = make(
        num_blocks, NUM_KV_HEADS, head_size, block_size, cache_dtype, device
    )
    k_scale = torch.tensor([0.37], device=device)
    v_scale = torch.tensor([2.5], device=device)
    fp8 = kv_cache_dtype != "auto"
    ref_k, ref_v = reshape_and_cache_ref(
        key,
        value,
        key_cache,
        value_cache,
        slots,
        k_scale if fp8 else None,
        v_scale if fp8 else None,
        flash=flash,
    )
    op = torch.ops._C.reshape_and_cache_flash if flash else torch.ops._C.reshape_and_cache
    op(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale)
    assert_bits_equal(key_cache, ref_k)
    assert_bits_equal(value_cache, ref_v)
    # Read the tokens back from the cache: they must be the inputs (within fp8 rounding).
    keep = slots >= 0
    got_k, got_v = gather_ref(key_cache, value_cache, slots[keep], flash=flash)
    if fp8:
        for got, x, scale in ((got_k, key[keep], k_scale), (got_v, value[keep], v_scale)):
            atol = FP8_TOL["atol"] * float(scale)
            torch.testing.assert_close(
                from_cache_ref(got, scale), x.float(), rtol=FP8_TOL["rtol"], atol=atol
            )
    else:
        assert_bits_equal(got_k, key[keep])
        assert_bits_equal(got_v, value[keep])


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(device, dtype, block_size, head_size, tokens):
    pattern = "consecutive" if (head_size + block_size) % 3 else "random"
    run_and_check(device, dtype, block_size, head_size, tokens, False, pattern)


@pytest.mark.parametrize("pattern", ["random", "consecutive"])
@pytest.mark.parametrize("tokens", [1, 2, 3, 5, 8, 9, 17, 31, 33, 64, 100])
@pytest.mark.parametrize("head_size", [64, 128, 192])
def test_reshape_and_cache_decode_groups(device, head_size, tokens, pattern):
    # Decode sizes with 16-bit values (the GPU takes the values in token groups of up to 8, a
    # row's pieces shuffled within each token's lanes): group sizes 1..8, a last tile and a last
    # group part empty, rows of 1, 2 and 3 warps' pieces (192: no power of two), padding slots;
    # fp16 into an fp8 cache at three of the sizes.
    run_and_check(device, torch.bfloat16, 16, head_size, tokens, False, pattern)
    if tokens in (3, 17, 64):
        run_and_check(
            device, torch.float16, 16, head_size, tokens, False, pattern, torch.uint8, "fp8"
        )


@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize("block_size", [8, 16, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flash", [False, True])
def test_reshape_and_cache_prefill_runs(device, dtype, block_size, head_size, flash):
    # Whole runs of tokens into consecutive slots of a block (copied as transposed tiles on CPU),
    # runs longer than 64 included.
    run_and_check(device, dtype, block_size, head_size, 301, flash, "runs")


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_flash(device, dtype, block_size, head_size, tokens):
    pattern = "random" if (head_size + block_size) % 3 else "consecutive"
    run_and_check(device, dtype, block_size, head_size, tokens, True, pattern)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
@pytest.mark.parametrize("cache_dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_fp8(device, dtype, head_size, flash, cache_dtype, kv_cache_dtype):
    run_and_check(
        device, dtype, 16, head_size, 83, flash, "consecutive", cache_dtype, kv_cache_dtype
    )


@pytest.mark.parametrize("flash", [False, True])
def test_fp8_rounding_edges(device, flash):
    """Saturation, infinities, NaN, subnormals and ties against torch's e4m3 rounding."""
    specials = [
        0.0,
        -0.0,
        448.0,
        -448.0,
        449.0,
        463.9,
        464.0,
        1e30,
        float("inf"),
        float("-inf"),
        2.0**-9,
        2.0**-10,
        3 * 2.0**-10,
        2.0**-6 - 2.0**-12,
        2.0**-6,
        2.0**-12,
        1.0625,
        1.1875,
        -1.0625,
        17.0,
        240.0,
        1e-30,
    ]
    head_size = 64
    vals = torch.tensor(specials, dtype=torch.float32)
    vals = torch.cat([vals, torch.randn(head_size - len(specials)) * 100])
    key = vals.reshape(1, 1, head_size).repeat(2, 1, 1).to(device)
    key[1] = key[1].nan_to_num(0.0) * 0.5
    key[1, 0, 0] = float("nan")
    value = -key
    slots = torch.tensor([3, 12], device=device)
    scale = torch.ones(1, device=device)
    make = flash_caches if flash else paged_caches
    key_cache, value_cache = make(2, 1, head_size, 8, torch.uint8, device)
    ref_k, ref_v = reshape_and_cache_ref(
        key, value, key_cache, value_cache, slots, scale, scale, flash=flash
    )
    op = torch.ops._C.reshape_and_cache_flash if flash else torch.ops._C.reshape_and_cache
    op(key, value, key_cache, value_cache, slots, "fp8", scale, scale)
    for got, ref in ((key_cache, ref_k), (value_cache, ref_v)):
        got_f, ref_f = got.view(torch.float8_e4m3fn).float(), ref.view(torch.float8_e4m3fn).float()
        torch.testing.assert_close(got_f, ref_f, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_misaligned_and_decode(device, dtype, flash):
    """Inputs at an odd element offset (the element-wise path), and a single decode token."""
    heads, head_size, block_size = 2, 64, 16
    base = torch.randn(5, 2 * heads * head_size + 1, dtype=dtype, device=device)
    key = base[:, 1 : 1 + heads * head_size].view(5, heads, head_size)
    value = base[:, 1 + heads * head_size :].view(5, heads, head_size)
    make = flash_caches if flash else paged_caches
    op = torch.ops._C.reshape_and_cache_flash if flash else torch.ops._C.reshape_and_cache
    one = torch.ones(1, device=device)
    for n, slots in ((5, [9, -1, 40, 3, 17]), (1, [33])):
        key_cache, value_cache = make(4, heads, head_size, block_size, dtype, device)
        s = torch.tensor(slots, device=device)
        ref_k, ref_v = reshape_and_cache_ref(
            key[:n], value[:n], key_cache, value_cache, s, flash=flash
        )
        op(key[:n], value[:n], key_cache, value_cache, s, "auto", one, one)
        assert_bits_equal(key_cache, ref_k)
        assert_bits_equal(value_cache, ref_v)


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_size_not_a_power_of_two(device, dtype, flash):
    # Slots split by a division (GPU: a multiply-high FastDiv) rather than a shift.
    run_and_check(device, dtype, 24, 128, 83, flash, "random")


@pytest.mark.parametrize("flash", [False, True])
def test_offsets_past_int32(device, flash, far_view):
    # A key cache whose blocks lie 2^28 elements apart (a view of 4 GiB, of which only the
    # written slots are touched): its offsets pass 2^31, so the GPU kernels take their
    # 64-bit-index path (the 32-bit one needs every offset of the launch to fit an int).
    dtype, heads, head_size, block_size, num_blocks, tokens = torch.bfloat16, 2, 64, 16, 9, 5
    key, value = fused_kv(tokens, heads, head_size, dtype, device)
    small_key, value_cache = (flash_caches if flash else paged_caches)(
        num_blocks, heads, head_size, block_size, dtype, device
    )
    key_cache = far_view(small_key.shape, (1 << 28, *small_key.stride()[1:]), dtype)
    key_cache.copy_(small_key)
    slots = torch.tensor(
        [8 * block_size + 3, 7, -1, 8 * block_size + 15, 4 * block_size], device=device
    )
    ref_k, ref_v = reshape_and_cache_ref(key, value, key_cache, value_cache, slots, flash=flash)
    op = torch.ops._C.reshape_and_cache_flash if flash else torch.ops._C.reshape_and_cache
    one = torch.ones(1, device=device)
    op(key, value, key_cache, value_cache, slots, "auto", one, one)
    assert_bits_equal(key_cache, ref_k)
    assert_bits_equal(value_cache, ref_v)


def test_slot_mapping_shorter_than_key(device):
    """Tokens past slot_mapping (padding for CUDA graphs) are not written."""
    key, value = fused_kv(9, 2, 64, torch.float16, device)
    key_cache, value_cache = paged_caches(3, 2, 64, 16, torch.float16, device)
    slots = torch.tensor([4, 5, 30, -1], device=device)
    ref_k, ref_v = reshape_and_cache_ref(key, value, key_cache, value_cache, slots)
    one = torch.ones(1, device=device)
    torch.ops._C.reshape_and_cache(key, value, key_cache, value_cache, slots, "auto", one, one)
    assert_bits_equal(key_cache, ref_k)
    assert_bits_equal(value_cache, ref_v)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32, torch.uint8])
@pytest.mark.parametrize("flash", [False, True])
def test_copy_blocks(device, cache_dtype, flash):
    num_layers, num_blocks, heads, head_size, block_size = 3, 11, 2, 80, 16
    make = flash_caches if flash else paged_caches
    layers = [
        make(num_blocks, heads, head_size, block_size, cache_dtype, device)
        for _ in range(num_layers)
    ]
    key_caches = [k for k, _ in layers]
    value_caches = [v for _, v in layers]
    mapping = torch.tensor([[0, 5], [3, 1], [3, 9], [10, 2]], device=device)
    ref_k, ref_v = copy_blocks_ref(key_caches, value_caches, mapping)
    torch.ops._C.copy_blocks(key_caches, value_caches, mapping)
    for got, ref in zip(key_caches + value_caches, ref_k + ref_v, strict=True):
        assert_bits_equal(got, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.uint8])
def test_swap_blocks_same_device(device, dtype):
    src = poisoned((9, 2, 64, 16), dtype, device)
    dst = poisoned((6, 2, 64, 16), dtype, device)
    mapping = torch.tensor([[8, 0], [2, 5], [0, 3]])
    ref = swap_blocks_ref(src, dst, mapping)
    torch.ops._C.swap_blocks(src, dst, mapping)
    assert_bits_equal(dst, ref)


@pytest.mark.parametrize("direction", ["to_cpu", "to_gpu"])
def test_swap_blocks_cpu_gpu(device, direction):
    if device != "cuda":
        pytest.skip("needs a GPU")
    gpu = poisoned((7, 3, 8, 16, 8), torch.bfloat16, device)
    cpu = poisoned((5, 3, 8, 16, 8), torch.bfloat16, "cpu").pin_memory()
    src, dst = (gpu, cpu) if direction == "to_cpu" else (cpu, gpu)
    mapping = torch.tensor([[1, 4], [0, 0], [3, 2]])
    ref = swap_blocks_ref(src, dst, mapping)
    torch.ops._C.swap_blocks(src, dst, mapping)
    torch.cuda.synchronize()
    assert_bits_equal(dst, ref)


def _reshape_args(device):
    key, value = fused_kv(5, 2, 64, torch.float16, device)
    key_cache, value_cache = paged_caches(4, 2, 64, 16, torch.float16, device)
    slots = torch.tensor([0, 1, 2, -1, 40], device=device)
    one = torch.ones(1, device=device)
    return [key, value, key_cache, value_cache, slots, "auto", one, one]


def _with(i, v):
    def edit(args):
        args[i] = v(args) if callable(v) else v
        return args

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        (_with(5, "int8"), 'kv_cache_dtype must be "auto", "fp8" or "fp8_e4m3"'),
        (_with(5, "fp8_e5m2"), "E5M2 caches are not supported"),
        (_with(4, lambda a: a[4].int()), "slot_mapping must be int64"),
        (_with(4, lambda a: a[4].reshape(5, 1)), "slot_mapping must be a contiguous 1-D"),
        (_with(4, lambda a: torch.cat([a[4], a[4]])), "slot_mapping has 10 slots"),
        (_with(0, lambda a: a[0].double()), "float32, float16 or bfloat16"),
        (_with(1, lambda a: a[1].float()), "value must be"),
        (_with(1, lambda a: a[1][:, :1]), "value must have the shape of key"),
        (_with(2, lambda a: a[2].float()), "the caches must have key's dtype"),
        (_with(2, lambda a: a[2].view(4, 2, 16, 8, 8)[:, :, :, :, :4]), "key_cache must be"),
        (_with(2, lambda a: a[2].reshape(4, 2, 128, 8)), "the paged layout takes key_cache"),
        (_with(3, lambda a: a[3][:, :, :32]), "value_cache must be"),
        (
            _with(2, lambda a: a[2].transpose(2, 3).contiguous().transpose(2, 3)),
            "key_cache must be contiguous within each head",
        ),
        (_with(5, "fp8"), "key_cache must be uint8 or float8_e4m3fn"),
        (
            lambda a: _with(1, a[1][:, :, :44])(_with(0, a[0][:, :, :44])(a)),
            "head_size 44 must be a multiple of x = 8",
        ),
    ],
)
def test_reshape_rejects_bad_input(device, edit, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.reshape_and_cache(*edit(_reshape_args(device)))


def test_rejects_bad_fp8_scale_and_flash_layout(device):
    key, value, *_ = _reshape_args(device)
    k8, v8 = paged_caches(4, 2, 64, 16, torch.uint8, device)
    slots = torch.tensor([0, 1, 2, 3, 4], device=device)
    one = torch.ones(1, device=device)
    with pytest.raises(RuntimeError, match="k_scale must be a one-element float32 tensor"):
        torch.ops._C.reshape_and_cache(key, value, k8, v8, slots, "fp8", one.half(), one)
    with pytest.raises(RuntimeError, match="v_scale must be a one-element float32 tensor"):
        torch.ops._C.reshape_and_cache(key, value, k8, v8, slots, "fp8", one, torch.ones(2))
    kc, vc = paged_caches(4, 2, 64, 16, torch.float16, device)
    with pytest.raises(RuntimeError, match="the flash layout takes caches"):
        torch.ops._C.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", one, one)
    kf, vf = flash_caches(4, 2, 64, 16, torch.float16, device)
    with pytest.raises(RuntimeError, match="the paged layout takes"):
        torch.ops._C.reshape_and_cache(key, value, kf, vf, slots, "auto", one, one)
    with pytest.raises(RuntimeError, match="value_cache must have the shape of key_cache"):
        torch.ops._C.reshape_and_cache_flash(key, value, kf, vf[:, :8], slots, "auto", one, one)
    with pytest.raises(RuntimeError, match=r"key_cache must be \[num_blocks, block_size, 2, 64\]"):
        torch.ops._C.reshape_and_cache_flash(key, value, kf[:, :, :1], vf, slots, "auto", one, one)


def test_rejects_caches_that_are_one_memory_or_have_no_slots(device):
    key, value, key_cache, value_cache, slots, _, one, _ = _reshape_args(device)
    kf, vf = flash_caches(4, 2, 64, 16, torch.float16, device)
    with pytest.raises(RuntimeError, match="key_cache and value_cache are the same memory"):
        torch.ops._C.reshape_and_cache_flash(key, value, kf, kf, slots, "auto", one, one)
    # The halves of one [2, ...] or [num_blocks, 2, ...] tensor are fine.
    kv = torch.zeros(4, 2, 16, 2, 64, dtype=torch.float16, device=device)
    slots = torch.tensor([0, 1, 2, -1, 40], device=device)
    torch.ops._C.reshape_and_cache_flash(key, value, kv[:, 0], kv[:, 1], slots, "auto", one, one)
    ref_k, ref_v = reshape_and_cache_ref(
        key, value, torch.zeros_like(kv[:, 0]), torch.zeros_like(kv[:, 1]), slots, flash=True
    )
    assert_bits_equal(kv[:, 0], ref_k)
    assert_bits_equal(kv[:, 1], ref_v)
    empty_k = torch.zeros(4, 2, 8, 0, 8, dtype=torch.float16, device=device)
    empty_v = torch.zeros(4, 2, 64, 0, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match=r"block_size \(dimension 3 of key_cache"):
        torch.ops._C.reshape_and_cache(key, value, empty_k, empty_v, slots, "auto", one, one)


def test_block_copies_that_would_race_are_rejected(device):
    # The copies of a call run concurrently: a block written twice, or written by one row and
    # read by another, would give an order-dependent result.
    layers = [paged_caches(4, 2, 64, 16, torch.float16, device) for _ in range(2)]
    kcs, vcs = [k for k, _ in layers], [v for _, v in layers]
    with pytest.raises(RuntimeError, match="reads block 1, which another row writes"):
        torch.ops._C.copy_blocks(kcs, vcs, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(RuntimeError, match="writes block 3 more than once"):
        torch.ops._C.copy_blocks(kcs, vcs, torch.tensor([[0, 3], [1, 3]]))
    # One source to several destinations is fine.
    mapping = torch.tensor([[0, 2], [0, 3]])
    ref_k, ref_v = copy_blocks_ref(kcs, vcs, mapping)
    torch.ops._C.copy_blocks(kcs, vcs, mapping)
    for got, ref in zip(kcs + vcs, ref_k + ref_v, strict=True):
        assert_bits_equal(got, ref)
    t = poisoned((6, 2, 64, 16), torch.float16, device)
    with pytest.raises(RuntimeError, match="reads block 0, which another row writes"):
        torch.ops._C.swap_blocks(t, t, torch.tensor([[0, 1], [1, 0]]))
    with pytest.raises(RuntimeError, match="writes block 5 more than once"):
        torch.ops._C.swap_blocks(
            t, poisoned((6, 2, 64, 16), torch.float16, device), torch.tensor([[0, 5], [1, 5]])
        )
    mapping = torch.tensor([[0, 4], [1, 5]])
    ref = swap_blocks_ref(t, t.clone(), mapping)
    torch.ops._C.swap_blocks(t, t, mapping)
    assert_bits_equal(t, ref)


def test_rejects_out_of_range_slot_on_cpu(device):
    if device != "cpu":
        pytest.skip("the GPU kernels skip such slots instead (checking would synchronise)")
    args = _reshape_args(device)
    args[4] = torch.tensor([0, 1, 64, -1, 3], device=device)
    with pytest.raises(
        RuntimeError, match="slot_mapping holds slot 64 but the caches have only 64"
    ):
        torch.ops._C.reshape_and_cache(*args)


def test_out_of_range_slot_skipped_on_gpu(device):
    if device == "cpu":
        pytest.skip("the CPU backend rejects such slots")
    args = _reshape_args(device)
    args[4] = torch.tensor([0, 1, 64, -1, 3], device=device)
    ref_k, ref_v = reshape_and_cache_ref(
        args[0], args[1], args[2], args[3], torch.tensor([0, 1, -1, -1, 3], device=device)
    )
    torch.ops._C.reshape_and_cache(*args)
    assert_bits_equal(args[2], ref_k)
    assert_bits_equal(args[3], ref_v)


def test_block_ops_reject_bad_input(device):
    k, v = paged_caches(4, 2, 64, 16, torch.float16, device)
    k2, v2 = paged_caches(4, 2, 64, 16, torch.float16, device)
    mapping = torch.tensor([[0, 1]], device=device)
    with pytest.raises(RuntimeError, match="got 2 key caches but 1 value caches"):
        torch.ops._C.copy_blocks([k, k2], [v], mapping)
    with pytest.raises(RuntimeError, match="every tensor of key_caches must match"):
        torch.ops._C.copy_blocks([k, k2[:2]], [v, v2], mapping)
    with pytest.raises(RuntimeError, match="block_mapping must be int64"):
        torch.ops._C.copy_blocks([k], [v], mapping.int())
    with pytest.raises(RuntimeError, match=r"block_mapping must be a contiguous \[num_pairs, 2\]"):
        torch.ops._C.copy_blocks([k], [v], mapping.reshape(2))
    with pytest.raises(RuntimeError, match="names a block outside"):
        torch.ops._C.copy_blocks([k], [v], torch.tensor([[0, 4]]))  # checked where on the CPU
    with pytest.raises(RuntimeError, match="each block of key_caches"):
        torch.ops._C.copy_blocks([k.transpose(1, 2)], [v], mapping)
    cpu_mapping = torch.tensor([[0, 1]])
    with pytest.raises(RuntimeError, match="dst must be"):
        torch.ops._C.swap_blocks(k, k2.float(), cpu_mapping)
    with pytest.raises(RuntimeError, match="src and dst blocks must have one shape"):
        torch.ops._C.swap_blocks(k, v2, cpu_mapping)
    with pytest.raises(RuntimeError, match="names a block outside"):
        torch.ops._C.swap_blocks(k, k2, torch.tensor([[7, 1]]))


def test_opcheck(device):
    args = _reshape_args(device)
    torch.library.opcheck(torch.ops._C.reshape_and_cache.default, tuple(args))
    key, value = fused_kv(5, 2, 64, torch.bfloat16, device)
    kf, vf = flash_caches(4, 2, 64, 16, torch.bfloat16, device)
    slots = torch.tensor([0, 17, -1, 3, 60], device=device)
    one = torch.ones(1, device=device)
    torch.library.opcheck(
        torch.ops._C.reshape_and_cache_flash.default, (key, value, kf, vf, slots, "auto", one, one)
    )
    k8, v8 = paged_caches(4, 2, 64, 16, torch.uint8, device)
    torch.library.opcheck(
        torch.ops._C.reshape_and_cache.default,
        (key, value, k8, v8, slots, "fp8", one * 0.5, one * 2),
    )
    ks = [paged_caches(4, 2, 64, 16, torch.float16, device) for _ in range(2)]
    torch.library.opcheck(
        torch.ops._C.copy_blocks.default,
        ([k for k, _ in ks], [v for _, v in ks], torch.tensor([[0, 2], [1, 3]], device=device)),
    )
    src, dst = ks[0][0].clone(), ks[1][0].clone()
    torch.library.opcheck(torch.ops._C.swap_blocks.default, (src, dst, torch.tensor([[3, 0]])))


def test_torch_compile(device):
    def f(key, value, key_cache, value_cache, kf, vf, slots, scale):
        torch.ops._C.reshape_and_cache(
            key, value, key_cache, value_cache, slots, "auto", scale, scale
        )
        torch.ops._C.reshape_and_cache_flash(key * 2, value, kf, vf, slots, "auto", scale, scale)
        return key_cache.sum(), vf[0].clone()

    key, value = fused_kv(11, 2, 64, torch.float32, device)
    kc, vc = paged_caches(3, 2, 64, 8, torch.float32, device)
    kf, vf = flash_caches(3, 2, 64, 8, torch.float32, device)
    kc.zero_()
    slots = torch.randperm(24)[:11].to(device)
    slots[4] = -1
    scale = torch.ones(1, device=device)
    ref_kc, ref_vc = reshape_and_cache_ref(key, value, kc, vc, slots)
    ref_kf, ref_vf = reshape_and_cache_ref(key * 2, value, kf, vf, slots, flash=True)
    total, v0 = torch.compile(f, fullgraph=True, backend="aot_eager")(
        key, value, kc, vc, kf, vf, slots, scale
    )
    assert_bits_equal(kc, ref_kc)
    assert_bits_equal(vc, ref_vc)
    assert_bits_equal(kf, ref_kf)
    assert_bits_equal(vf, ref_vf)
    assert_bits_equal(v0, ref_vf[0])
    torch.testing.assert_close(total, ref_kc.sum())


def test_python_wrappers(device):
    from aphrodite_ext import ops

    key, value = fused_kv(9, 2, 64, torch.bfloat16, device)
    slots = torch.tensor([5, -1, 17, 0, 30, 31, 2, 9, 40], device=device)
    for flash, fn in ((False, ops.reshape_and_cache), (True, ops.reshape_and_cache_flash)):
        make = flash_caches if flash else paged_caches
        kc, vc = make(3, 2, 64, 16, torch.bfloat16, device)
        ref_k, ref_v = reshape_and_cache_ref(key, value, kc, vc, slots, flash=flash)
        fn(key, value, kc, vc, slots)
        assert_bits_equal(kc, ref_k)
        assert_bits_equal(vc, ref_v)
    k8, v8 = paged_caches(3, 2, 64, 16, torch.uint8, device)
    scale = torch.tensor([0.5], device=device)
    ref_k, ref_v = reshape_and_cache_ref(key, value, k8, v8, slots, scale, scale)
    ops.reshape_and_cache(key, value, k8, v8, slots, "fp8", scale, scale)
    assert_bits_equal(k8, ref_k)
    assert_bits_equal(v8, ref_v)
    layers = [paged_caches(3, 2, 64, 16, torch.bfloat16, device) for _ in range(2)]
    kcs, vcs = [k for k, _ in layers], [v for _, v in layers]
    mapping = torch.tensor([[2, 0]], device=device)
    ref_kcs, ref_vcs = copy_blocks_ref(kcs, vcs, mapping)
    ops.copy_blocks(kcs, vcs, mapping)
    for got, ref in zip(kcs + vcs, ref_kcs + ref_vcs, strict=True):
        assert_bits_equal(got, ref)
    ref = swap_blocks_ref(kcs[0], kcs[1], torch.tensor([[0, 1]]))
    ops.swap_blocks(kcs[0], kcs[1], torch.tensor([[0, 1]]))
    assert_bits_equal(kcs[1], ref)
