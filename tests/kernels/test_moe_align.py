"""moe_align_block_size against the plain-torch reference, plus the contract checked directly."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.moe_align import moe_align_block_size_ref, moe_align_capacity

POISON = -7  # no valid output entry is ever -7


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_moe_C")


def _routed_ids(tokens, experts, k, device, dtype=torch.int32, skew=False):
    """topk ids with distinct experts per token; skew=True crowds tokens onto a few experts
    (so some experts fill many blocks and others none)."""
    scores = torch.rand(tokens, experts)
    if skew:
        scores += torch.linspace(0, 3, experts)[torch.randperm(experts)] ** 2
    return scores.topk(k, dim=-1).indices.to(dtype).to(device)


def _outputs(device, capacity, num_blocks):
    kw = dict(dtype=torch.int32, device=device)
    return (
        torch.full((capacity,), POISON, **kw),
        torch.full((num_blocks,), POISON, **kw),
        torch.full((1,), POISON, **kw),
    )


def _run(ids, experts, block, expert_map=None, extra=0):
    capacity = moe_align_capacity(ids.numel(), experts, block) + extra
    num_blocks = (capacity + block - 1) // block
    sorted_ids, experts_ids, total = _outputs(ids.device, capacity, num_blocks)
    torch.ops._moe_C.moe_align_block_size(
        ids, experts, block, sorted_ids, experts_ids, total, expert_map
    )
    return sorted_ids.cpu(), experts_ids.cpu(), total.cpu(), capacity, num_blocks


def _check_contract(ids, experts, block, sorted_ids, experts_ids, total, expert_map=None):
    """The contract of moe_align.h, checked without the reference."""
    flat = ids.cpu().reshape(-1).long()
    numel = flat.numel()
    valid = (flat >= 0) & (flat < experts)
    keys = torch.where(valid, flat, 0)
    if expert_map is not None:
        keys = expert_map.cpu().long()[keys]
        valid &= (keys >= 0) & (keys < experts)
    keys = torch.where(valid, keys, -1)
    t = int(total[0])
    assert t % block == 0 and 0 <= t <= sorted_ids.numel()
    assert (sorted_ids[t:] == numel).all(), "entries past the total hold the sentinel"
    assert (experts_ids[t // block :] == -1).all(), "blocks past the total hold -1"
    s = sorted_ids[:t].long()
    owner = experts_ids[: t // block].long().repeat_interleave(block)
    real = s != numel
    # Every kept entry exactly once, in its expert's blocks.
    assert torch.equal(torch.sort(s[real]).values, torch.nonzero(valid).reshape(-1))
    assert torch.equal(keys[s[real]], owner[real])
    # Experts in ascending order, each with ceil(count / block) blocks, entries first (in
    # ascending order), padding after.
    counts = torch.bincount(keys[valid], minlength=experts)
    assert torch.equal(
        torch.bincount(experts_ids[: t // block].long(), minlength=experts),
        (counts + block - 1) // block,
    )
    assert (owner[1:] >= owner[:-1]).all()
    pos = 0
    for e in torch.nonzero(counts).reshape(-1).tolist():
        c = int(counts[e])
        group = s[pos : pos + c]
        assert (group[1:] > group[:-1]).all(), f"expert {e}: entries not ascending"
        pos += (c + block - 1) // block * block
        assert (s[pos - ((-c) % block) : pos] == numel).all()
    assert pos == t


def _check(ids, experts, block, expert_map=None, extra=0):
    sorted_ids, experts_ids, total, capacity, num_blocks = _run(
        ids, experts, block, expert_map, extra
    )
    ref = moe_align_block_size_ref(
        ids.cpu(),
        experts,
        block,
        capacity,
        num_blocks,
        None if expert_map is None else expert_map.cpu(),
    )
    assert torch.equal(total, ref[2])
    assert torch.equal(sorted_ids, ref[0])
    assert torch.equal(experts_ids, ref[1])
    _check_contract(ids, experts, block, sorted_ids, experts_ids, total, expert_map)


@pytest.mark.parametrize("tokens", [1, 7, 16, 83, 256, 4096])
@pytest.mark.parametrize("experts", [8, 64, 83, 256])
@pytest.mark.parametrize("k", [2, 8])
@pytest.mark.parametrize("block", [16, 64, 128])
def test_matches_reference(device, tokens, experts, k, block):
    _check(_routed_ids(tokens, experts, k, device), experts, block)


@pytest.mark.parametrize("tokens", [7, 83, 4096])
@pytest.mark.parametrize("experts, k", [(8, 2), (64, 8), (256, 8)])
def test_skewed_routing_int64_ids(device, tokens, experts, k):
    # Many tokens on the same few experts: long groups of many blocks, empty experts between.
    ids = _routed_ids(tokens, experts, k, device, torch.int64, skew=True)
    _check(ids, experts, 16)


@pytest.mark.parametrize("experts", [8, 83, 256])
def test_repeated_experts_in_a_row(device, experts):
    # Not produced by a top-k, but the op does not need distinct ids within a token.
    ids = torch.randint(0, min(experts, 3), (83, 4), dtype=torch.int32).to(device)
    _check(ids, experts, 16)


@pytest.mark.parametrize("tokens", [1, 83, 4096])
@pytest.mark.parametrize("experts, k", [(8, 2), (64, 8), (256, 8)])
@pytest.mark.parametrize("block", [16, 64])
def test_expert_map(device, tokens, experts, k, block):
    # This rank holds a random half of the experts, numbered 0.. in a shuffled order.
    local = torch.randperm(experts)[: experts // 2]
    expert_map = torch.full((experts,), -1, dtype=torch.int32)
    expert_map[local] = torch.randperm(local.numel(), dtype=torch.int32)
    ids = _routed_ids(tokens, experts, k, device)
    _check(ids, experts, block, expert_map.to(device))


def test_ids_outside_num_experts_are_dropped(device):
    ids = _routed_ids(83, 64, 4, "cpu")
    ids[::5, 0] = 64
    ids[3, 1] = -1
    ids[10] = 1000
    sorted_ids, _, total, _, _ = _run(ids.to(device), 64, 16)
    kept = sorted_ids[: int(total[0])]
    dropped = torch.nonzero(((ids < 0) | (ids >= 64)).reshape(-1)).reshape(-1)
    assert not torch.isin(kept, dropped).any()
    _check(ids.to(device), 64, 16)


def test_larger_outputs_are_filled(device):
    _check(_routed_ids(83, 64, 8, device), 64, 64, extra=1000)


def test_no_tokens(device):
    ids = torch.empty(0, 8, dtype=torch.int32, device=device)
    sorted_ids, experts_ids, total, _, _ = _run(ids, 64, 16, extra=40)
    assert int(total[0]) == 0
    assert (sorted_ids == 0).all() and (experts_ids == -1).all()


def test_deterministic(device):
    ids = _routed_ids(4096, 64, 8, device, skew=True)
    first = _run(ids, 64, 64)
    for _ in range(3):
        again = _run(ids, 64, 64)
        assert all(torch.equal(a, b) for a, b in zip(first[:3], again[:3], strict=True))


def _bad_call(device, **over):
    args = dict(
        topk_ids=torch.zeros(4, 2, dtype=torch.int32, device=device),
        num_experts=8,
        block_size=4,
        sorted_token_ids=torch.empty(8 + 8 * 3, dtype=torch.int32, device=device),
        experts_ids=torch.empty(8, dtype=torch.int32, device=device),
        num_tokens_post_pad=torch.empty(1, dtype=torch.int32, device=device),
        maybe_expert_map=None,
    )
    args.update(over)
    torch.ops._moe_C.moe_align_block_size(*args.values())


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(topk_ids=torch.zeros(4, 2)), "topk_ids must be Int or Long"),
        (dict(topk_ids=torch.zeros(8, dtype=torch.int32)), r"topk_ids must be \[num_tokens"),
        (
            dict(topk_ids=torch.zeros(2, 4, dtype=torch.int32).t()),
            "topk_ids must be contiguous",
        ),
        (dict(num_experts=0), r"num_experts must be in \[1, 4096\]"),
        (dict(num_experts=5000), r"num_experts must be in \[1, 4096\]"),
        (dict(block_size=0), r"block_size must be in \[1, 2147483647\]"),
        (dict(sorted_token_ids=torch.empty(31, dtype=torch.int32)), "at least .* = 32"),
        (dict(sorted_token_ids=torch.empty(32, dtype=torch.int64)), "sorted_token_ids must be"),
        (dict(experts_ids=torch.empty(7, dtype=torch.int32)), "experts_ids must hold at least"),
        (dict(num_tokens_post_pad=torch.empty(2, dtype=torch.int32)), "one element"),
        (dict(num_tokens_post_pad=torch.empty(1)), "num_tokens_post_pad must be Int"),
        (dict(maybe_expert_map=torch.zeros(7, dtype=torch.int32)), r"must be \[num_experts\]"),
        (dict(maybe_expert_map=torch.zeros(8)), "maybe_expert_map must be Int"),
    ],
)
def test_rejects_bad_input(device, over, match):
    over = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in over.items()}
    with pytest.raises(RuntimeError, match=match):
        _bad_call(device, **over)


def test_few_tokens_need_less_room(device):
    # 2 entries touch at most 2 experts: 2 + 2 * 127 entries suffice for 256 experts.
    ids = torch.tensor([[5, 200]], dtype=torch.int32, device=device)
    sorted_ids, experts_ids, total, capacity, _ = _run(ids, 256, 128)
    assert capacity == 256 and int(total[0]) == 256
    assert experts_ids.tolist() == [5, 200]
    assert sorted_ids[0] == 0 and sorted_ids[128] == 1


def test_opcheck(device):
    ids = _routed_ids(9, 16, 4, device)
    cap = moe_align_capacity(ids.numel(), 16, 8)
    outs = _outputs(device, cap, (cap + 7) // 8)
    torch.library.opcheck(torch.ops._moe_C.moe_align_block_size.default, (ids, 16, 8, *outs, None))
    expert_map = torch.arange(16, dtype=torch.int32, device=device) - 4
    torch.library.opcheck(
        torch.ops._moe_C.moe_align_block_size.default, (ids, 16, 8, *outs, expert_map)
    )


def test_torch_compile(device):
    def f(ids):
        cap = moe_align_capacity(ids.numel(), 32, 16)
        kw = dict(dtype=torch.int32, device=ids.device)
        s = torch.empty(cap, **kw)
        e = torch.empty((cap + 15) // 16, **kw)
        t = torch.empty(1, **kw)
        torch.ops._moe_C.moe_align_block_size(ids, 32, 16, s, e, t, None)
        return s + 0, e * 1, t

    ids = _routed_ids(21, 32, 4, device)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(ids)
    ref = moe_align_block_size_ref(ids.cpu(), 32, 16)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize(
    "tokens, experts, k, mapped",
    [
        (128, 8, 8, False),  # 1024 entries: the last size of the small-block launch
        (1025, 8, 1, False),  # 1025: the first of the full block
        (300, 4096, 8, False),  # the most experts (2 histogram rows fit)
        (300, 4096, 8, True),  # with the map in shared memory (1 row)
        (16384, 256, 8, True),  # 131072 entries, 4096 per chunk warp
    ],
)
def test_launch_boundaries(device, tokens, experts, k, mapped):
    expert_map = None
    if mapped:
        expert_map = torch.randperm(experts, dtype=torch.int32) - experts // 3
        expert_map[expert_map >= 2 * experts // 3] = -1
        expert_map = expert_map.to(device)
    _check(_routed_ids(tokens, experts, k, device, skew=True), experts, 64, expert_map)
