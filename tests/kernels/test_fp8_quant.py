"""static, dynamic per-tensor and dynamic per-token fp8 quantization against the plain-torch
references of aphrodite_ext.ops.fp8_quant.

The kernels divide by the scale in fp32 and round to nearest even exactly as the references do,
so the fp8 bytes must be identical; the scales are the same fp32 operations (a max, a division,
a min/max), so they must agree to fp32 rounding."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.fp8_quant import (
    FP8_DTYPE,
    MIN_PER_TOKEN_SCALE,
    dynamic_per_token_scaled_fp8_quant_ref,
    dynamic_scaled_fp8_quant_ref,
    static_scaled_fp8_quant_ref,
)

# Per input dtype: fp8 codes the result may differ by (none: same division, same rounding) and
# the relative tolerance of the fp32 scales.
TOL = {
    torch.float32: {"fp8_codes": 0, "scale_rtol": 1.2e-7},
    torch.float16: {"fp8_codes": 0, "scale_rtol": 1.2e-7},
    torch.bfloat16: {"fp8_codes": 0, "scale_rtol": 1.2e-7},
}
TOKENS = [1, 7, 83, 4096]
HIDDEN = [768, 769, 5120, 5125]
FP8_NAN_BYTE = 0x7F  # poison: no finite input quantizes to it


@pytest.fixture(autouse=True)
def _family_built(device):
    built, why = aphrodite_ext.family_status("fp8_quant")
    if not built:
        pytest.skip(why)
    aphrodite_ext.load("_C")


def poisoned_result(shape, device):
    return torch.full(shape, FP8_NAN_BYTE, dtype=torch.uint8, device=device).view(FP8_DTYPE)


def poisoned_scale(shape, device):
    return torch.full(shape, float("nan"), dtype=torch.float32, device=device)


def make_input(shape, dtype, device, spread=3.0):
    """Normal values over a few binades, with some rows scaled up and a few outliers."""
    x = torch.randn(*shape, device=device) * spread
    rows = x.reshape(-1, shape[-1])
    rows *= torch.exp2(torch.randint(-4, 5, (rows.shape[0], 1), device=device).float())
    flat = x.view(-1)
    idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 1000),), device=device)
    flat[idx] *= 50.0
    return x.to(dtype)


def assert_fp8_equal(out, ref, dtype):
    assert out.dtype == FP8_DTYPE and out.shape == ref.shape
    got = out.contiguous().view(torch.uint8).to(torch.int16)
    want = ref.contiguous().view(torch.uint8).to(torch.int16)
    # Distance in codes, counted within one sign (sign-magnitude bytes).
    same_sign = (got & 0x80) == (want & 0x80)
    codes = torch.where(same_sign, (got & 0x7F) - (want & 0x7F), torch.full_like(got, 255)).abs()
    bad = codes > TOL[dtype]["fp8_codes"]
    if bad.any():
        i = int(bad.view(-1).nonzero()[0])
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} fp8 values differ; first at flat index {i}: "
            f"got byte {int(got.view(-1)[i]):#04x} ({float(out.float().reshape(-1)[i])}), "
            f"expected {int(want.view(-1)[i]):#04x} ({float(ref.float().reshape(-1)[i])})"
        )


def assert_scale_close(scale, ref, dtype):
    torch.testing.assert_close(
        scale, ref.reshape(scale.shape), rtol=TOL[dtype]["scale_rtol"], atol=0
    )


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_static(device, dtype, tokens, hidden):
    x = make_input((tokens, hidden), dtype, device)
    # A scale below max|x| / 448 for part of the cases, so that some values saturate.
    amax = float(x.float().abs().max())
    scale = torch.tensor([amax / 448 * float(torch.empty(()).uniform_(0.6, 2.0))], device=device)
    out = poisoned_result(x.shape, device)
    torch.ops._C.static_scaled_fp8_quant(out, x, scale)
    assert_fp8_equal(out, static_scaled_fp8_quant_ref(x, scale), dtype)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_dynamic(device, dtype, tokens, hidden):
    x = make_input((tokens, hidden), dtype, device)
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((1,), device)
    torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
    ref_out, ref_scale = dynamic_scaled_fp8_quant_ref(x)
    assert_scale_close(scale, ref_scale, dtype)
    assert_fp8_equal(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_per_token(device, dtype, tokens, hidden):
    x = make_input((tokens, hidden), dtype, device)
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((tokens, 1), device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
    ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
    assert_scale_close(scale, ref_scale, dtype)
    assert_fp8_equal(out, ref_out, dtype)


# Widths that reach every per-token path: narrow rows sharing a block, rows in registers, rows
# read twice (> 4096 vectors), and tails after the last whole vector.
@pytest.mark.parametrize("hidden", [1, 5, 8, 31, 264, 2056, 16389, 40000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_widths(device, dtype, hidden):
    tokens = 3 if hidden > 10000 else 37
    x = make_input((tokens, hidden), dtype, device)
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((tokens, 1), device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
    ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
    assert_scale_close(scale, ref_scale, dtype)
    assert_fp8_equal(out, ref_out, dtype)


@pytest.mark.parametrize("op", ["static", "dynamic", "per_token"])
@pytest.mark.parametrize("in_offset, out_offset", [(0, 0), (8, 16), (3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_strided_rows(device, dtype, op, in_offset, out_offset):
    # Row strides of whole 16-byte vectors: aligned offsets take the vector path (with a tail of
    # 1027 % 8 elements), odd offsets the one-element path.
    tokens, hidden = 19, 1027
    base = make_input((tokens, hidden + 45), dtype, device)
    x = base[:, in_offset : in_offset + hidden]
    out_base = poisoned_result((tokens, hidden + 29), device)
    out = out_base[:, out_offset : out_offset + hidden]
    untouched = out_base.view(torch.uint8).clone()
    untouched[:, out_offset : out_offset + hidden] = 0
    if op == "static":
        scale = torch.tensor([float(x.float().abs().max()) / 300], device=device)
        torch.ops._C.static_scaled_fp8_quant(out, x, scale)
        ref_out = static_scaled_fp8_quant_ref(x, scale)
    elif op == "dynamic":
        scale = poisoned_scale((1,), device)
        torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
        ref_out, ref_scale = dynamic_scaled_fp8_quant_ref(x)
        assert_scale_close(scale, ref_scale, dtype)
    else:
        scale = poisoned_scale((tokens, 1), device)
        torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
        ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
        assert_scale_close(scale, ref_scale, dtype)
    assert_fp8_equal(out, ref_out, dtype)
    # Nothing outside the result's view was written.
    after = out_base.view(torch.uint8).clone()
    after[:, out_offset : out_offset + hidden] = 0
    assert torch.equal(after, untouched)


@pytest.mark.parametrize("op", ["static", "dynamic", "per_token"])
def test_three_dim_input(device, op):
    x = make_input((2, 5, 4096), torch.bfloat16, device)
    out = poisoned_result(x.shape, device)
    if op == "static":
        scale = torch.tensor([0.01], device=device)
        torch.ops._C.static_scaled_fp8_quant(out, x, scale)
        assert_fp8_equal(out, static_scaled_fp8_quant_ref(x, scale), torch.bfloat16)
        return
    if op == "dynamic":
        scale = poisoned_scale((1,), device)
        torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
        ref_out, ref_scale = dynamic_scaled_fp8_quant_ref(x)
    else:
        scale = poisoned_scale((10, 1), device)
        torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
        ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
    assert_scale_close(scale, ref_scale, torch.bfloat16)
    assert_fp8_equal(out, ref_out, torch.bfloat16)


@pytest.mark.parametrize("dtype", list(TOL))
def test_static_saturates(device, dtype):
    x = make_input((9, 777), dtype, device)
    x[0, :4] = torch.tensor([1e4, -1e4, 460.0, -470.0], dtype=dtype)
    # Elements above the median magnitude (half of them) are beyond 448 * scale. (A mean-based
    # scale let the outliers of make_input push that share under 10 % in a few % of draws.)
    scale = torch.tensor([float(x.float().abs().median()) / 448], device=device)
    out = poisoned_result(x.shape, device)
    torch.ops._C.static_scaled_fp8_quant(out, x, scale)
    ref = static_scaled_fp8_quant_ref(x, scale)
    assert_fp8_equal(out, ref, dtype)
    beyond = (x.float() / scale).abs() >= 448
    assert beyond.sum() > x.numel() // 10
    assert torch.equal(out.float()[beyond].abs(), torch.full_like(out.float()[beyond], 448.0))


@pytest.mark.parametrize("dtype", list(TOL))
def test_static_special_scales(device, dtype):
    # Scale 1 keeps exactly representable values; a power of two only shifts exponents.
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, 448.0, 0.001953125, 3.1, -1000.0], dtype=dtype)
    x = x.to(device).repeat(11, 3)
    for s in (1.0, 0.25, 4.0, 1e-30, 1e30):
        scale = torch.tensor([s], device=device)
        out = poisoned_result(x.shape, device)
        torch.ops._C.static_scaled_fp8_quant(out, x, scale)
        assert_fp8_equal(out, static_scaled_fp8_quant_ref(x, scale), dtype)


def rounding_edge_values():
    """Every finite E4M3 value, the midpoints between neighbours (ties, which round to even) and
    the floats one ulp either side of them, values near 448, 464 and 480 (saturation), the
    subnormal range, infinities; both signs."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    special = torch.tensor(
        [447.0, 448.0, 449.0, 463.9, 464.0, 464.1, 479.0, 480.0, 481.0, 1e4, 3e38, float("inf")]
        + [2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10, 2.0**-11, 1e-30, 1e-45]
    )
    values = torch.cat([codes, mids, up, down, special])
    return torch.cat([values, -values])


@pytest.mark.parametrize("op", ["static", "per_token"])
def test_rounding_edges(device, op):
    v = rounding_edge_values().to(device)
    n = v.numel() // 4 * 4
    x = v[:n].reshape(4, -1)
    out = poisoned_result(x.shape, device)
    if op == "static":
        # Scale 1: the division is exact, so this checks the conversion alone.
        scale = torch.ones(1, device=device)
        torch.ops._C.static_scaled_fp8_quant(out, x, scale)
        ref = static_scaled_fp8_quant_ref(x, scale)
    else:
        # Per token with a row max of 448 * 2^k: scales are powers of two, divisions exact.
        x = x.clamp(-448, 448) * torch.tensor([[1.0], [0.5], [2.0**-4], [2.0**6]], device=device)
        x[:, 0] = 448.0 * torch.tensor([1.0, 0.5, 2.0**-4, 2.0**6], device=device)
        scale = poisoned_scale((4, 1), device)
        torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
        ref, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
        assert_scale_close(scale, ref_scale, torch.float32)
    assert_fp8_equal(out, ref, torch.float32)


@pytest.mark.parametrize("tokens, hidden", [(1, 768), (4096, 5120), (83, 5125)])
@pytest.mark.parametrize("dtype", list(TOL))
def test_zero_input(device, dtype, tokens, hidden):
    # Defined behaviour: dynamic per-tensor writes scale 0 and divides by 1 (signed zeros out);
    # per token, every scale is the floor 1 / (448 * 512). Nothing divides by zero.
    x = torch.zeros(tokens, hidden, dtype=dtype, device=device)
    x.view(-1)[::3] = -0.0
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((1,), device)
    torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
    assert float(scale) == 0.0
    assert_fp8_equal(out, dynamic_scaled_fp8_quant_ref(x)[0], dtype)
    assert torch.equal(out.view(torch.uint8) & 0x7F, torch.zeros_like(out.view(torch.uint8)))

    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((tokens, 1), device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
    expected = torch.tensor(MIN_PER_TOKEN_SCALE, dtype=torch.float32, device=device)
    assert torch.equal(scale, expected.expand(tokens, 1))
    assert_fp8_equal(out, dynamic_per_token_scaled_fp8_quant_ref(x)[0], dtype)


def test_per_token_zero_and_tiny_rows(device):
    x = make_input((6, 1000), torch.float16, device)
    x[1] = 0
    x[4] = torch.randn(1000, device=device) * 1e-4  # max below 448 * the floor: floored
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((6, 1), device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, None)
    ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x)
    assert float(ref_scale[1]) == float(ref_scale[4]) == pytest.approx(MIN_PER_TOKEN_SCALE)
    assert_scale_close(scale, ref_scale, torch.float16)
    assert_fp8_equal(out, ref_out, torch.float16)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("tokens, hidden", [(7, 769), (83, 5120), (1, 5125)])
def test_per_token_scale_ub(device, dtype, tokens, hidden):
    x = make_input((tokens, hidden), dtype, device)
    row_max = x.float().abs().amax(-1)
    ub = torch.tensor([float(row_max.median()) * 0.9], device=device)
    out = poisoned_result(x.shape, device)
    scale = poisoned_scale((tokens, 1), device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, ub)
    ref_out, ref_scale = dynamic_per_token_scaled_fp8_quant_ref(x, ub)
    assert_scale_close(scale, ref_scale, dtype)
    assert_fp8_equal(out, ref_out, dtype)
    capped = row_max > ub
    assert capped.any()
    capped_scale = ub / ub.new_tensor(448.0)  # a tensor divisor: a true division on CUDA too
    torch.testing.assert_close(
        scale[capped], capped_scale.expand(int(capped.sum())).reshape(-1, 1), rtol=0, atol=0
    )
    # The capped rows saturate: their largest elements become +-448.
    assert bool((out.float()[capped].abs().amax(-1) == 448).all())


def test_empty_inputs(device):
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    out = torch.empty(0, 64, dtype=FP8_DTYPE, device=device)
    torch.ops._C.static_scaled_fp8_quant(out, x, torch.ones(1, device=device))
    scale = poisoned_scale((1,), device)
    torch.ops._C.dynamic_scaled_fp8_quant(out, x, scale)
    assert float(scale) == 0.0
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, poisoned_scale((0, 1), device), None)


def _call(op, out, x, scale, ub=None):
    if op == "per_token":
        return torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, ub)
    return getattr(torch.ops._C, f"{op}_scaled_fp8_quant")(out, x, scale)


@pytest.mark.parametrize("op", ["static", "dynamic", "per_token"])
@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda o, x, s: (o.view(torch.uint8), x, s), "result must be Float8_e4m3fn"),
        (lambda o, x, s: (o.view(torch.uint8).view(torch.int8), x, s), "result must be Float8"),
        (lambda o, x, s: (o[:-1], x, s), "result must have the shape of input"),
        (lambda o, x, s: (o, x.double(), s), "float32, float16 or bfloat16"),
        (lambda o, x, s: (o, x, s.half()), "scale must be Float"),
        (lambda o, x, s: (o, x, torch.cat([s, s])), "scale must be a contiguous float32 tensor"),
        (lambda o, x, s: (o.t(), x.t(), s), "contiguous in its last dimension"),
        # result over input's own bytes, and rows of result over each other
        (lambda o, x, s: (x.view(FP8_DTYPE)[:, :64], x, s), "result shares memory with input"),
        (lambda o, x, s: (o[:1].expand(4, 64), x, s), "rows that share memory"),
    ],
)
def test_rejects_bad_input(device, op, bad, match):
    x = torch.randn(4, 64, dtype=torch.float16, device=device)
    out = torch.empty(4, 64, dtype=FP8_DTYPE, device=device)
    scale = torch.ones((4, 1) if op == "per_token" else (1,), device=device)
    args = bad(out, x, scale)
    with pytest.raises(RuntimeError, match=match):
        _call(op, *args)


def test_rejects_bad_scale_ub(device):
    x = torch.randn(4, 64, device=device)
    out = torch.empty(4, 64, dtype=FP8_DTYPE, device=device)
    scale = torch.empty(4, 1, device=device)
    with pytest.raises(RuntimeError, match="scale_ub must be Float"):
        _call("per_token", out, x, scale, torch.ones(1, dtype=torch.float64, device=device))
    with pytest.raises(RuntimeError, match=r"scale_ub must be a contiguous float32 tensor .*\[1\]"):
        _call("per_token", out, x, scale, torch.ones(2, device=device))
    with pytest.raises(RuntimeError, match=r"scale must be .*\[num_tokens, 1\]"):
        _call("per_token", out, x, torch.empty(3, 1, device=device))


@pytest.mark.parametrize("op", ["static", "dynamic", "per_token"])
def test_rejects_device_mismatch(device, op):
    if device == "cpu":
        pytest.skip("needs a second device type")
    x = torch.randn(4, 64, device=device)
    out = torch.empty(4, 64, dtype=FP8_DTYPE, device=device)
    scale = torch.ones(4, 1) if op == "per_token" else torch.ones(1)
    with pytest.raises(RuntimeError, match="scale is on cpu"):
        _call(op, out, x, scale)
    with pytest.raises(RuntimeError, match="result is on cpu"):
        _call(op, out.cpu(), x, scale.to(device))
    if op == "per_token":
        with pytest.raises(RuntimeError, match="scale_ub is on cpu"):
            _call(op, out, x, scale.to(device), torch.ones(1))


def test_mutates_only_declared_arguments(device):
    # The schema's `Tensor!` marks; opcheck's own schema test cannot compare fp8 tensors.
    x = make_input((5, 300), torch.bfloat16, device)
    x_before = x.clone()
    scale = torch.tensor([0.05], device=device)
    scale_before = scale.clone()
    out = poisoned_result(x.shape, device)
    torch.ops._C.static_scaled_fp8_quant(out, x, scale)
    assert torch.equal(x, x_before) and torch.equal(scale, scale_before)
    torch.ops._C.dynamic_scaled_fp8_quant(out, x, poisoned_scale((1,), device))
    assert torch.equal(x, x_before)
    ub = torch.tensor([1.5], device=device)
    torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, poisoned_scale((5, 1), device), ub)
    assert torch.equal(x, x_before) and float(ub) == 1.5


# opcheck's test_schema compares mutated tensors with torch.allclose, which has no fp8 kernel;
# test_mutates_only_declared_arguments covers what it would check.
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck(device):
    x = make_input((5, 83), torch.bfloat16, device)
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=device)
    torch.library.opcheck(
        torch.ops._C.static_scaled_fp8_quant.default,
        (out, x, torch.tensor([0.02], device=device)),
        test_utils=OPCHECK_UTILS,
    )
    torch.library.opcheck(
        torch.ops._C.dynamic_scaled_fp8_quant.default,
        (out, x, torch.empty(1, device=device)),
        test_utils=OPCHECK_UTILS,
    )
    for ub in (None, torch.tensor([0.5], device=device)):
        torch.library.opcheck(
            torch.ops._C.dynamic_per_token_scaled_fp8_quant.default,
            (out, x, torch.empty(5, 1, device=device), ub),
            test_utils=OPCHECK_UTILS,
        )


def test_torch_compile(device):
    def f(x, ub):
        out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
        scale = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
        torch.ops._C.dynamic_per_token_scaled_fp8_quant(out, x, scale, ub)
        tensor_out = torch.empty_like(out)
        tensor_scale = torch.empty(1, dtype=torch.float32, device=x.device)
        torch.ops._C.dynamic_scaled_fp8_quant(tensor_out, x, tensor_scale)
        return out.float() * scale, tensor_out.float() * tensor_scale

    x = make_input((6, 96), torch.bfloat16, device)
    ub = torch.tensor([2.0], device=device)
    got_token, got_tensor = torch.compile(f, fullgraph=True, backend="aot_eager")(x, ub)
    ref_q, ref_s = dynamic_per_token_scaled_fp8_quant_ref(x, ub)
    ref_tq, ref_ts = dynamic_scaled_fp8_quant_ref(x)
    torch.testing.assert_close(got_token, ref_q.float() * ref_s, rtol=0, atol=0)
    torch.testing.assert_close(got_tensor, ref_tq.float() * ref_ts, rtol=0, atol=0)


def test_wrappers(device):
    from aphrodite_ext import ops

    x = make_input((3, 5, 200), torch.float16, device)
    scale = torch.tensor([0.03], device=device)
    assert_fp8_equal(
        ops.static_scaled_fp8_quant(x, scale), static_scaled_fp8_quant_ref(x, scale), torch.float16
    )
    out, s = ops.dynamic_scaled_fp8_quant(x)
    ref_out, ref_s = dynamic_scaled_fp8_quant_ref(x)
    assert_fp8_equal(out, ref_out, torch.float16)
    assert_scale_close(s, ref_s, torch.float16)
    ub = torch.tensor([5.0], device=device)
    out, s = ops.dynamic_per_token_scaled_fp8_quant(x, ub)
    ref_out, ref_s = dynamic_per_token_scaled_fp8_quant_ref(x, ub)
    assert s.shape == (15, 1)
    assert_fp8_equal(out, ref_out, torch.float16)
    assert_scale_close(s, ref_s, torch.float16)
