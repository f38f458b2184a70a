"""moe_sum against the fp32 reference."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.moe_sum import moe_sum_ref

# Against torch's fp32 sum (whose order of additions may differ from ours): fp32 differences
# are rounding of the order, fp16/bf16 ones at most one unit of the output's last place.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=8e-3),
}
DTYPES = list(TOL)


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_moe_C")


def _poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _sequential_ref(x):
    """The kernels' exact arithmetic: fp32 adds in ascending k, one rounding at the end."""
    acc = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = acc + x[:, k].float().cpu()
    return acc.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 83, 256])
@pytest.mark.parametrize("topk", [1, 2, 3, 8, 10])
@pytest.mark.parametrize("hidden", [8, 769, 4096, 5125])
def test_matches_reference(device, dtype, tokens, topk, hidden):
    x = torch.randn(tokens, topk, hidden, dtype=dtype, device=device)
    out = _poisoned((tokens, hidden), dtype, device)
    torch.ops._moe_C.moe_sum(x, out)
    out = out.cpu()
    assert not out.isnan().any()
    torch.testing.assert_close(out, moe_sum_ref(x.cpu()), **TOL[dtype])
    assert torch.equal(out, _sequential_ref(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("topk", [2, 8])
def test_strided(device, dtype, topk):
    # Input: every other k of a wider tensor, hidden offset by 3 (unaligned); output: a slice.
    base = torch.randn(83, 2 * topk, 780, dtype=dtype, device=device)
    x = base[:, ::2, 3:772]
    out_base = _poisoned((83, 800), dtype, device)
    out = out_base[:, 5:774]
    torch.ops._moe_C.moe_sum(x, out)
    assert torch.equal(out.cpu(), _sequential_ref(x))
    assert out_base[:, :5].isnan().all() and out_base[:, 774:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_values_accumulate_in_fp32(device, dtype):
    # 1024 + 1 has no bf16 value: a running sum kept in the element type would lose the ones.
    x = torch.tensor([1024.0, 1.0, -1024.0, 1.0, 1024.0, 1.0, -1024.0, 1.0], dtype=dtype)
    x = x.reshape(1, 8, 1).expand(3, 8, 16).contiguous().to(device)
    out = _poisoned((3, 16), dtype, device)
    torch.ops._moe_C.moe_sum(x, out)
    assert (out.cpu().float() == 4.0).all()


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x, o: (x[:, 0], o), r"input must be \[num_tokens, topk, hidden\]"),
        (lambda x, o: (x, o[:-1]), r"output must be \[num_tokens, hidden\] = \[4, 64\]"),
        (lambda x, o: (x, o.half()), "output must be Float"),
        (lambda x, o: (x.int(), o.int()), "input must be float32, float16 or bfloat16"),
        (lambda x, o: (x.transpose(1, 2).contiguous().transpose(1, 2), o), "contiguous"),
        (lambda x, o: (x, o.t().contiguous().t()), "output must be contiguous"),
        (lambda x, o: (x, x.view(4, -1)[:, 5:69]), "output shares memory with input"),
        (lambda x, o: (x, o[:1].expand(4, 64)), "rows that share memory"),
    ],
)
def test_rejects_bad_input(device, bad, match):
    x = torch.randn(4, 2, 64, device=device)
    o = torch.empty(4, 64, device=device)
    with pytest.raises(RuntimeError, match=match):
        torch.ops._moe_C.moe_sum(*bad(x, o))


def test_opcheck(device):
    x = torch.randn(5, 3, 40, dtype=torch.bfloat16, device=device)
    o = torch.empty(5, 40, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(torch.ops._moe_C.moe_sum.default, (x, o))


def test_torch_compile(device):
    def f(x):
        o = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
        torch.ops._moe_C.moe_sum(x, o)
        return o * 2

    x = torch.randn(9, 4, 96, device=device)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got.cpu(), 2 * _sequential_ref(x))
