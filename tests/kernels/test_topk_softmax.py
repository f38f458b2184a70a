"""topk_softmax against the fp32 reference."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.topk_softmax import topk_softmax_ref


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_moe_C")


def _distinct_logits(tokens, experts, dtype, device):
    # A random permutation per row: distinct values, so the top-k is unambiguous in any dtype.
    ranks = torch.rand(tokens, experts).argsort(-1).float()
    return (ranks / experts * 8 - 4).to(dtype).to(device)


def _run(gating, k, renormalize):
    t = gating.shape[0]
    w = torch.full((t, k), float("nan"), device=gating.device)
    ids = torch.full((t, k), -7, dtype=torch.int32, device=gating.device)
    src = torch.full((t, k), -7, dtype=torch.int32, device=gating.device)
    torch.ops._moe_C.topk_softmax(w, ids, src, gating, renormalize)
    return w, ids, src


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 83, 256])
@pytest.mark.parametrize(
    "experts, k", [(8, 2), (7, 3), (64, 8), (83, 5), (128, 8), (256, 8), (512, 8), (600, 4)]
)
@pytest.mark.parametrize("renormalize", [False, True])
def test_matches_reference(device, dtype, tokens, experts, k, renormalize):
    gating = _distinct_logits(tokens, experts, dtype, device)
    w, ids, src = _run(gating, k, renormalize)
    ref_w, ref_ids = topk_softmax_ref(gating.cpu(), k, renormalize)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(w.cpu(), ref_w, atol=1e-5, rtol=1e-5)
    expected_src = (torch.arange(k)[None, :] * tokens + torch.arange(tokens)[:, None]).int()
    assert torch.equal(src.cpu(), expected_src)


def test_strided_gating(device):
    base = _distinct_logits(19, 80, torch.float32, device)
    gating = base[:, 8:72]
    w, ids, _ = _run(gating, 6, False)
    ref_w, ref_ids = topk_softmax_ref(gating.cpu(), 6)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(w.cpu(), ref_w)


@pytest.mark.parametrize("experts", [8, 64, 256, 83])
def test_nan_and_inf_rows_give_distinct_valid_ids(device, experts):
    k = 8 if experts >= 8 else 4
    gating = torch.randn(5, experts, device=device)
    gating[0] = float("nan")
    gating[1] = float("-inf")
    gating[2, ::2] = float("nan")
    gating[3, 3] = float("inf")
    gating[4] = float("inf")
    _, ids, _ = _run(gating, k, True)
    for row in ids.cpu():
        assert len(set(row.tolist())) == k, row
        assert row.min() >= 0 and row.max() < experts, row


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda w, i, s, g: (w, i.long(), s, g), "topk_indices must be Int"),
        (lambda w, i, s, g: (w.half(), i, s, g), "topk_weights must be Float"),
        (lambda w, i, s, g: (w, i[:-1], s, g), "topk_indices must have shape"),
        (lambda w, i, s, g: (w, i, s, g[:, None]), r"gating_output must be \[num_tokens"),
    ],
)
def test_rejects_bad_input(device, bad, match):
    g = torch.randn(4, 16, device=device)
    w = torch.empty(4, 2, device=device)
    i = torch.empty(4, 2, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=match):
        torch.ops._moe_C.topk_softmax(*bad(w, i, i.clone(), g), False)


def test_k_larger_than_experts_is_rejected(device):
    g = torch.randn(4, 3, device=device)
    w = torch.empty(4, 4, device=device)
    i = torch.empty(4, 4, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"must be in \[1, 3\]"):
        torch.ops._moe_C.topk_softmax(w, i, i.clone(), g, False)


def test_opcheck(device):
    g = torch.randn(6, 64, device=device)
    w = torch.empty(6, 4, device=device)
    i = torch.empty(6, 4, dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops._moe_C.topk_softmax.default, (w, i, i.clone(), g, True))


def test_torch_compile(device):
    def f(g):
        w = torch.empty(g.shape[0], 2, device=g.device)
        i = torch.empty(g.shape[0], 2, dtype=torch.int32, device=g.device)
        torch.ops._moe_C.topk_softmax(w, i, torch.empty_like(i), g, True)
        return w * 2, i

    g = _distinct_logits(10, 32, torch.float32, device)
    w, ids = torch.compile(f, fullgraph=True, backend="aot_eager")(g)
    ref_w, ref_ids = topk_softmax_ref(g.cpu(), 2, True)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(w.cpu(), 2 * ref_w)
