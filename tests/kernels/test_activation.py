"""silu_and_mul, gelu_and_mul, gelu_tanh_and_mul against the fp32 reference."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.activation import act_and_mul_ref

# (atol, rtol) per dtype: fp32 math, one rounding to the output dtype.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
OPS = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]


def _op(name):
    aphrodite_ext.load("_C")
    return getattr(torch.ops._C, name)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", list(TOL))
# (64, 4096) takes the GPU's half-vector path for decode sizes, (512, 4096) its whole vectors.
@pytest.mark.parametrize(
    "shape", [(7, 1), (83, 769), (3, 5, 5125), (1, 4096), (257, 8), (64, 4096), (512, 4096)]
)
def test_matches_reference(device, name, dtype, shape):
    *lead, d = shape
    x = torch.randn(*lead, 2 * d, dtype=dtype, device=device) * 3
    out = torch.full((*lead, d), float("nan"), dtype=dtype, device=device)  # poison
    _op(name)(out, x)
    torch.testing.assert_close(
        out, act_and_mul_ref(name, x), atol=TOL[dtype][0], rtol=TOL[dtype][1]
    )


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d, pad", [(769, 5), (768, 8)])  # element-wise; 16-byte vectors
def test_strided_rows(device, name, d, pad):
    # Input rows padded to a wider stride, output a column slice of a wider buffer.
    base = torch.randn(11, 2 * d + 64, dtype=torch.bfloat16, device=device)
    x = base[:, 32 : 32 + 2 * d]
    out_buf = torch.full((11, d + pad), float("nan"), dtype=torch.bfloat16, device=device)
    out = out_buf[:, :d]
    _op(name)(out, x)
    torch.testing.assert_close(out, act_and_mul_ref(name, x), atol=1.6e-2, rtol=1.6e-2)
    assert torch.isnan(out_buf[:, d:]).all(), "wrote past the output slice"


def test_extreme_values(device):
    x = torch.tensor([[-100.0, 100.0, 0.0, -1e30, 1.0, 2.0, 3.0, 4.0]], device=device)
    out = torch.empty(1, 4, device=device)
    _op("silu_and_mul")(out, x)
    torch.testing.assert_close(out, act_and_mul_ref("silu_and_mul", x), atol=1e-5, rtol=1e-5)


# Exact GELU over its whole range: a dense sweep (every interval of the CPU kernels' polynomial
# table and both ends of each), large and tiny magnitudes and the special values, against float64.
GELU_SPECIALS = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-30, 1e-7, -1e-7, 0.75, -0.75, 6.0, -6.0]
GELU_SPECIALS += [5.999999, -5.999999, 6.000001, -6.000001, 13.0, -13.0, 1e4, -1e4, 1e30, -1e30]
GELU_SPECIALS += [float("inf"), float("-inf"), float("nan")]


def _gelu_f64(x):
    x = x.double()
    return x * torch.special.ndtr(x)


def _gelu_inputs(dtype, device):
    x = torch.cat([torch.linspace(-8, 8, 160001), torch.tensor(GELU_SPECIALS)]).to(dtype)
    gate = torch.ones_like(x)
    return x, torch.cat([x, gate]).unsqueeze(0).to(device)


def _cpu_accuracy_only(device):
    if device != "cpu":
        # The CUDA kernel computes 0.5 x (1 + erf(x / sqrt 2)) in fp32, as torch's CUDA gelu
        # does; below x = -4 the sum cancels and the relative accuracy these tests hold the CPU
        # kernels' interval polynomials to is not met (absolute error < 1.3e-7). The other
        # tests check it against the fp32 reference.
        pytest.skip("the whole-range accuracy bound is the CPU kernels'")


def test_gelu_accuracy_fp32(device):
    _cpu_accuracy_only(device)
    x, inp = _gelu_inputs(torch.float32, device)
    out = torch.full((1, x.numel()), float("nan"), device=device)
    _op("gelu_and_mul")(out, inp)
    # Phi is within a few fp32 ulps of the truth relative to itself down to x = -4.5 and within
    # 4e-6 to x = -6; below, |gelu| < 6e-9 (the kernels may give 0, as torch's fp32 gelu does from
    # x = -5.6 on); -inf gives NaN, as torch's does.
    torch.testing.assert_close(
        out[0].cpu().double(), _gelu_f64(x), rtol=5e-6, atol=6e-9, equal_nan=True
    )


def test_gelu_accuracy_bf16(device):
    _cpu_accuracy_only(device)
    x, inp = _gelu_inputs(torch.bfloat16, device)
    out = torch.full((1, x.numel()), float("nan"), dtype=torch.bfloat16, device=device)
    _op("gelu_and_mul")(out, inp)
    expected = _gelu_f64(x).to(torch.bfloat16).double()
    # One rounding to bf16 of an fp32 result: at most one bf16 ulp from the rounded truth (or
    # below 6e-9 in magnitude, as in the fp32 test).
    torch.testing.assert_close(
        out[0].cpu().double(), expected, rtol=2.0**-7, atol=6e-9, equal_nan=True
    )


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x, out: (out, x[:, :-1]), "must be even"),
        (lambda x, out: (out[:, :-1], x), "out must have shape"),
        (lambda x, out: (out.float(), x), "out must be"),
        (lambda x, out: (out, x.int()), "must be float32, float16 or bfloat16"),
        (lambda x, out: (out, x.t().contiguous().t()), "contiguous in its last dimension"),
    ],
)
def test_rejects_bad_input(device, bad, match):
    x = torch.randn(6, 16, dtype=torch.bfloat16, device=device)
    out = torch.empty(6, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match=match):
        _op("silu_and_mul")(*bad(x, out))


def test_empty_is_a_no_op(device):
    for shape in [(0, 16), (2, 0, 16), (0, 3, 16)]:
        x = torch.randn(*shape, device=device)
        out = torch.empty(*shape[:-1], 8, device=device)
        _op("silu_and_mul")(out, x)


def test_out_in_place_over_the_first_half_of_input(device):
    # Each element of out is read (as x) before it is written, by the one thread that writes
    # it: out = input[..., :d] is allowed, and correct.
    x = torch.randn(16, 512, device=device)
    ref = act_and_mul_ref("silu_and_mul", x)
    _op("silu_and_mul")(x[:, :256], x)
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(x[:, :256], ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    "make_out, match",
    [
        (lambda x: x[:, 1:257], "out shares memory with input"),  # overlaps x and gate
        (lambda x: x[:, 256:], "out shares memory with input"),  # the gate half
        (lambda x: x.view(-1)[8:].view(-1)[: 16 * 256].view(16, 256), "shares memory"),
        (lambda x: torch.empty(1, 256, device=x.device).expand(16, 256), "rows that share"),
    ],
)
def test_out_that_would_read_what_it_wrote_is_rejected(device, make_out, match):
    x = torch.randn(16, 512, device=device)
    with pytest.raises(RuntimeError, match=match):
        _op("silu_and_mul")(make_out(x), x)


def _addresses(t):
    """The storage offsets of t's elements (from its metadata alone: `t.cpu()` would be a copy
    with offsets of its own on a GPU)."""
    idx = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    return set(idx.as_strided(t.shape, t.stride(), t.storage_offset()).flatten().tolist())


def test_overlap_check_is_exact_for_slices_of_one_buffer(device):
    # out and input as column slices (one row stride) of one buffer, at random offsets: the op
    # runs exactly where they share no element, or where out is input's first half in place.
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    d = 8
    for _ in range(60):
        stride = int(torch.randint(2 * d, 4 * d, (1,), generator=gen))
        rows = int(torch.randint(1, 5, (1,), generator=gen))
        buf = torch.randn(rows + 2, stride, device=device)
        i, o = (int(v) for v in torch.randint(0, stride - 2 * d + 1, (2,), generator=gen))
        ri, ro = (int(v) for v in torch.randint(0, 2, (2,), generator=gen))
        x = buf[ri : ri + rows, i : i + 2 * d]
        out = buf[ro : ro + rows, o : o + d]
        shared = _addresses(out) & _addresses(x)
        allowed = not shared or (ri == ro and i == o)
        if allowed:
            ref = act_and_mul_ref("silu_and_mul", x)
            _op("silu_and_mul")(out, x)
            atol, rtol = TOL[torch.float32]
            torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
        else:
            with pytest.raises(RuntimeError, match="out shares memory with input"):
                _op("silu_and_mul")(out, x)


def test_meta_beside_real_tensors_is_rejected(device):
    # A meta tensor sends the call to the fake kernel, which would return without computing.
    out = torch.full((4, 4), 123.0, device=device)
    with pytest.raises(RuntimeError, match="meta"):
        _op("silu_and_mul")(out, torch.randn(4, 8, device="meta"))
    assert (out == 123.0).all()
    _op("silu_and_mul")(torch.empty(4, 4, device="meta"), torch.empty(4, 8, device="meta"))


@pytest.mark.parametrize("name", OPS)
def test_opcheck(device, name):
    x = torch.randn(5, 2 * 83, device=device)
    out = torch.empty(5, 83, device=device)
    torch.library.opcheck(_op(name).default, (out, x))


def test_torch_compile(device):
    def f(x):
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device=x.device)
        torch.ops._C.silu_and_mul(out, x)
        return out * 2

    _op("silu_and_mul")
    x = torch.randn(9, 2 * 77, device=device)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), 2 * act_and_mul_ref("silu_and_mul", x))


def test_offsets_past_int32(device, far_view):
    # Rows 2^30 elements apart: the last row's offsets pass 2^31, so the GPU kernels take their
    # 64-bit-index path (the 32-bit one needs every offset of the launch to fit an int).
    d = 200
    x = far_view((3, 2 * d), ((1 << 30) + 64, 1))
    x.copy_(torch.randn(3, 2 * d, device=device) * 3)
    for name in OPS:
        out = torch.full((3, d), float("nan"), dtype=torch.bfloat16, device=device)
        _op(name)(out, x)
        torch.testing.assert_close(out, act_and_mul_ref(name, x), atol=1.6e-2, rtol=1.6e-2)
