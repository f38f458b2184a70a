"""rotary_embedding against the fp32 reference: neox and GPT-J, full and partial rotary, GQA and
no key, strided query/key views (fused qkv slices, padded or transposed heads, misaligned
buffers), float32 and query-dtype caches, int64 and int32 positions."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.rotary import rotary_embedding, rotary_embedding_ref

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
HEAD_ROT = [(128, 128), (128, 64), (80, 80), (64, 32)]
# (tokens, query heads, key heads or None)
HEADS = [(7, 4, 4), (83, 8, 2), (83, 3, None)]
MAX_POSITION = 300


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_C")


def make_cache(rows, rot_dim, dtype, device):
    """Random cos/sin values: unlike real angles they make a swapped or misindexed cos/sin
    visible at every position."""
    return torch.randn(rows, rot_dim, dtype=torch.float32, device=device).to(dtype)


def positions_for(shape, device, dtype=torch.int64, max_position=MAX_POSITION):
    return torch.randint(0, max_position, shape, dtype=dtype, device=device)


def check_head_parts(out, ref, head_size, rot_dim, dtype):
    """Every rotated element against the reference; every element past rot_dim bit-exact."""
    o = out.reshape(-1, head_size)
    r = ref.reshape(-1, head_size)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(o[:, :rot_dim], r[:, :rot_dim], atol=atol, rtol=rtol)
    assert torch.equal(o[:, rot_dim:], r[:, rot_dim:]), "elements past rot_dim changed"


def run_and_check(positions, query, key, head_size, cache, is_neox, wrapper=False):
    ref_q, ref_k = rotary_embedding_ref(positions, query, key, head_size, cache, is_neox)
    if wrapper:
        out_q, out_k = rotary_embedding(positions, query, key, head_size, cache, is_neox)
        assert out_q is query and out_k is key
    else:
        torch.ops._C.rotary_embedding(positions, query, key, head_size, cache, is_neox)
    rot_dim = cache.shape[-1]
    check_head_parts(query, ref_q, head_size, rot_dim, query.dtype)
    if key is not None:
        check_head_parts(key, ref_k, head_size, rot_dim, key.dtype)


@pytest.mark.parametrize("cache_fp32", [False, True], ids=["cache_dtype", "cache_fp32"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"t{h[0]}_q{h[1]}_k{h[2]}")
@pytest.mark.parametrize("head_rot", HEAD_ROT, ids=lambda h: f"head{h[0]}_rot{h[1]}")
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", list(TOL))
def test_rotary_embedding(device, dtype, is_neox, head_rot, heads, cache_fp32):
    head_size, rot_dim = head_rot
    tokens, num_heads, num_kv_heads = heads
    cache = make_cache(MAX_POSITION, rot_dim, torch.float32 if cache_fp32 else dtype, device)
    positions = positions_for((tokens,), device)
    query = torch.randn(tokens, num_heads * head_size, dtype=dtype, device=device)
    key = None
    if num_kv_heads is not None:
        key = torch.randn(tokens, num_kv_heads * head_size, dtype=dtype, device=device)
    run_and_check(positions, query, key, head_size, cache, is_neox)


@pytest.mark.parametrize("heads_dim", [False, True], ids=["flat", "heads_dim"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_qkv_slices(device, dtype, is_neox, heads_dim):
    tokens, num_heads, num_kv_heads, head_size, rot_dim = 83, 8, 2, 128, 64
    q_size, k_size = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.randn(tokens, q_size + 2 * k_size, dtype=dtype, device=device)
    value_before = qkv[:, q_size + k_size :].clone()
    query, key = qkv[:, :q_size], qkv[:, q_size : q_size + k_size]
    if heads_dim:
        query = query.view(tokens, num_heads, head_size)
        key = key.view(tokens, num_kv_heads, head_size)
    cache = make_cache(MAX_POSITION, rot_dim, dtype, device)
    positions = positions_for((tokens,), device)
    run_and_check(positions, query, key, head_size, cache, is_neox, wrapper=True)
    assert torch.equal(qkv[:, q_size + k_size :], value_before), "value part changed"


@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("heads_dim", [False, True], ids=["flat", "heads_dim"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_batched_positions(device, is_neox, heads_dim, pos_dtype):
    batch, seq, num_heads, num_kv_heads, head_size = 3, 29, 6, 2, 64
    positions = positions_for((batch, seq), device, pos_dtype)
    shape = (batch, seq, num_heads, head_size) if heads_dim else (batch, seq, num_heads * head_size)
    query = torch.randn(shape, dtype=torch.float16, device=device)
    key = torch.randn(*shape[:2], num_kv_heads * head_size, dtype=torch.float16, device=device)
    cache = make_cache(MAX_POSITION, head_size, torch.float16, device)
    run_and_check(positions, query, key, head_size, cache, is_neox)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_padded_and_transposed_heads(device, is_neox):
    tokens, num_heads, head_size, rot_dim = 19, 5, 64, 32
    padded = torch.randn(tokens, num_heads, head_size + 24, dtype=torch.bfloat16, device=device)
    pad_before = padded[..., head_size:].clone()
    query = padded[..., :head_size]  # head stride head_size + 24
    key = torch.randn(3, tokens, head_size, dtype=torch.bfloat16, device=device).transpose(0, 1)
    cache = make_cache(MAX_POSITION, rot_dim, torch.float32, device)
    run_and_check(positions_for((tokens,), device), query, key, head_size, cache, is_neox)
    assert torch.equal(padded[..., head_size:], pad_before), "padding between heads changed"


@pytest.mark.parametrize("case", ["query_offset", "cache_offset", "odd_head_size"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_misaligned(device, dtype, is_neox, case):
    """Layouts that rule out 16-byte accesses (the GPU kernel's element-wise path)."""
    tokens, num_heads, num_kv_heads = 11, 4, 2
    head_size, rot_dim = (81, 64) if case == "odd_head_size" else (64, 64)
    offset = 1 if case == "query_offset" else 0
    buf = torch.randn(tokens, num_heads * head_size + offset, dtype=dtype, device=device)
    query = buf[:, offset:]
    key = torch.randn(tokens, num_kv_heads * head_size, dtype=dtype, device=device)
    cache_offset = 1 if case == "cache_offset" else 0
    cache = make_cache(MAX_POSITION, rot_dim + cache_offset, dtype, device)[:, cache_offset:]
    run_and_check(positions_for((tokens,), device), query, key, head_size, cache, is_neox)


@pytest.mark.parametrize(
    "tokens, num_heads, num_kv_heads, head_size, rot_dim, offset",
    [
        (1100, 1, None, 64, 32, 0),  # small per-token work: several tokens per GPU block
        (5, 600, 3, 64, 64, 0),  # more heads than a block's head slots
        (3, 2, 1, 1040, 1040, 1),  # element-wise path with more lanes than a block
        (1, 32, 8, 128, 128, 0),  # decode
        (7, 4, 2, 96, 24, 0),  # rot_dim / 2 = 12: 8-byte accesses on the GPU
        (7, 4, 2, 80, 20, 0),  # rot_dim / 2 = 10: 4-byte accesses (neox)
    ],
)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_block_shapes(device, is_neox, tokens, num_heads, num_kv_heads, head_size, rot_dim, offset):
    dtype = torch.bfloat16
    buf = torch.randn(tokens, num_heads * head_size + offset, dtype=dtype, device=device)
    query = buf[:, offset:]
    key = None
    if num_kv_heads is not None:
        key = torch.randn(tokens, num_kv_heads * head_size, dtype=dtype, device=device)
    cache = make_cache(MAX_POSITION, rot_dim, dtype, device)
    run_and_check(positions_for((tokens,), device), query, key, head_size, cache, is_neox)


def test_out_of_range_positions(device):
    """The CPU backend raises; the GPU kernel cannot check without a device sync and leaves
    such tokens unchanged (the cache is not read out of bounds)."""
    positions = positions_for((9,), device)
    positions[4] = MAX_POSITION
    positions[6] = -1
    query = torch.randn(9, 2 * 64, device=device)
    key = torch.randn(9, 64, device=device)
    cache = make_cache(MAX_POSITION, 64, torch.float32, device)
    if device == "cpu":
        with pytest.raises(RuntimeError, match=r"positions must be in \[0, 300\)"):
            torch.ops._C.rotary_embedding(positions, query, key, 64, cache, True)
        return
    valid = torch.ones(9, dtype=torch.bool, device=device)
    valid[4] = valid[6] = False
    ref_q, ref_k = rotary_embedding_ref(positions.clamp(0, MAX_POSITION - 1), query, key, 64, cache)
    ref_q = torch.where(valid[:, None], ref_q, query)
    ref_k = torch.where(valid[:, None], ref_k, key)
    torch.ops._C.rotary_embedding(positions, query, key, 64, cache, True)
    torch.testing.assert_close(query, ref_q)
    torch.testing.assert_close(key, ref_k)


def _bad_inputs():
    def base(device):
        return dict(
            positions=positions_for((7,), device, max_position=50),
            query=torch.randn(7, 4 * 64, dtype=torch.float16, device=device),
            key=torch.randn(7, 2 * 64, dtype=torch.float16, device=device),
            head_size=64,
            cos_sin_cache=make_cache(50, 32, torch.float16, device),
            is_neox=True,
        )

    def edit(**changes):
        return lambda d: {**d, **{k: f(d) for k, f in changes.items()}}

    return base, [
        (edit(query=lambda d: d["query"].double()), "query must be float32, float16 or bfloat16"),
        (edit(key=lambda d: d["key"].float()), "key must be Half, got Float"),
        (edit(cos_sin_cache=lambda d: d["cos_sin_cache"].bfloat16()), "cos_sin_cache must be"),
        (edit(cos_sin_cache=lambda d: d["cos_sin_cache"][:, :31]), "must be even"),
        (
            edit(cos_sin_cache=lambda d: make_cache(50, 128, d["query"].dtype, d["query"].device)),
            "must not exceed head_size",
        ),
        (edit(cos_sin_cache=lambda d: d["cos_sin_cache"][:0]), "at least one row"),
        (edit(cos_sin_cache=lambda d: d["cos_sin_cache"][None]), "cos_sin_cache must have shape"),
        (edit(query=lambda d: d["query"][:, :-3]), r"multiple of head_size \(64\)"),
        (edit(query=lambda d: d["query"].view(7, 4, 64)[..., :32]), "must equal head_size"),
        (edit(query=lambda d: d["query"][:, ::2]), "contiguous in its last dimension"),
        (edit(positions=lambda d: d["positions"].float()), "positions must be int64 or int32"),
        (edit(positions=lambda d: d["positions"][:6]), "must match the shape of positions"),
        (edit(positions=lambda d: d["positions"].view(7, 1, 1)), "positions must have shape"),
        (edit(key=lambda d: d["key"][:, None, None]), "key must have shape"),
        (edit(head_size=lambda d: 0), "head_size must be positive"),
        (edit(key=lambda d: d["query"]), "query and key must not share memory"),
        (edit(query=lambda d: d["query"][:1].expand(7, -1)), "query has elements that share"),
        # Heads 32 elements apart, 64 long: each head overlaps the next.
        (
            edit(query=lambda d: d["query"].as_strided((7, 4, 64), (256, 32, 1))),
            "query has elements that share",
        ),
        # Slices of one buffer whose columns 192..255 would rotate twice.
        (overlapping_slices, "query and key must not share memory"),
    ]


def overlapping_slices(d):
    qk = torch.randn(7, 320, dtype=d["query"].dtype, device=d["query"].device)
    return {**d, "query": qk[:, :256], "key": qk[:, 192:]}


_BASE, _BAD = _bad_inputs()


@pytest.mark.parametrize("bad, match", _BAD, ids=[m for _, m in _BAD])
def test_rejects_bad_input(device, bad, match):
    args = bad(_BASE(device))
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.rotary_embedding(*args.values())


def test_empty_inputs_are_a_no_op(device):
    cache = make_cache(50, 32, torch.float16, device)
    for shape in [(0,), (2, 0), (0, 3)]:
        positions = torch.zeros(shape, dtype=torch.int64, device=device)
        query = torch.randn(*shape, 4 * 64, dtype=torch.float16, device=device)
        key = torch.randn(*shape, 2, 64, dtype=torch.float16, device=device)
        torch.ops._C.rotary_embedding(positions, query, key, 64, cache, True)


def test_opcheck(device):
    positions = positions_for((5,), device)
    cache = make_cache(MAX_POSITION, 32, torch.float32, device)
    query = torch.randn(5, 3 * 64, device=device)
    key = torch.randn(5, 64, device=device)
    op = torch.ops._C.rotary_embedding.default
    torch.library.opcheck(op, (positions, query, key, 64, cache, True))
    torch.library.opcheck(op, (positions, query.clone(), None, 64, cache, False))


def test_torch_compile(device):
    def f(positions, query, key, cache):
        torch.ops._C.rotary_embedding(positions, query, key, 64, cache, True)
        return query * 2, key

    positions = positions_for((6,), device)
    cache = make_cache(MAX_POSITION, 64, torch.bfloat16, device)
    query = torch.randn(6, 4 * 64, dtype=torch.bfloat16, device=device)
    key = torch.randn(6, 64, dtype=torch.bfloat16, device=device)
    ref_q, ref_k = rotary_embedding_ref(positions, query, key, 64, cache, True)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_q, out_k = compiled(positions, query.clone(), key.clone(), cache)
    torch.testing.assert_close(out_q, ref_q * 2, atol=3.2e-2, rtol=1.6e-2)
    torch.testing.assert_close(out_k, ref_k, atol=1.6e-2, rtol=1.6e-2)
