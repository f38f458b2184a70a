"""rms_norm and fused_add_rms_norm against the fp32 reference."""

import pytest
import torch

import aphrodite_ext
from aphrodite_ext.ops.layernorm import fused_add_rms_norm_ref, rms_norm_ref

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
# (64, 256): narrow rows that fill their blocks exactly (the kernels' unchecked form).
SHAPES = [(7, 768), (83, 769), (4, 5120), (3, 5125), (2, 3, 8192), (1, 1), (129, 64), (64, 256)]


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_C")


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(device, dtype, shape):
    x = torch.randn(*shape, dtype=dtype, device=device) * 2 + 0.5
    w = torch.randn(shape[-1], dtype=dtype, device=device)
    eps = float(torch.empty(()).uniform_(1e-6, 1e-4))
    out = torch.full_like(x, float("nan"))
    torch.ops._C.rms_norm(out, x, w, eps)
    torch.testing.assert_close(out, rms_norm_ref(x, w, eps), atol=TOL[dtype][0], rtol=TOL[dtype][1])


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_add_rms_norm(device, dtype, shape):
    x = torch.randn(*shape, dtype=dtype, device=device)
    residual = torch.randn(*shape, dtype=dtype, device=device)
    w = torch.randn(shape[-1], dtype=dtype, device=device)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, residual, w, 1e-6)
    torch.ops._C.fused_add_rms_norm(x, residual, w, 1e-6)
    torch.testing.assert_close(residual, ref_residual, atol=0, rtol=0)
    torch.testing.assert_close(x, ref_out, atol=TOL[dtype][0], rtol=TOL[dtype][1])


# Thousands of rows of 513 to 2048 16-byte vectors take the two-pass kernel on CUDA: bf16 / fp16
# rows of 4104, 8192 and 12296 (513, 1024, 1537 vectors: two chunks a thread, partial and whole,
# four partial), fp32 rows of 2056, 4104 and 8192 (514, 1026, 2048: two partial, four partial and
# whole); the other widths take the one-pass kernels. Rows read from a wider tensor at a 16-byte
# offset, written to a strided output (whose padding must stay untouched) or in place. The CPU
# backend has no such path: a few rows there.
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("hidden", [2056, 4104, 8192, 12296])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "in_place"])
def test_rms_norm_many_rows(device, dtype, hidden, layout):
    rows = 4099 if device == "cuda" else 37
    pad = 16 // torch.empty((), dtype=dtype).element_size()
    base = torch.randn(rows, hidden + 3 * pad, dtype=dtype, device=device) * 2 + 0.5
    x = base[:, pad : pad + hidden] if layout == "strided" else base[:, :hidden].contiguous()
    w = torch.randn(hidden, dtype=dtype, device=device)
    eps = float(torch.empty(()).uniform_(1e-6, 1e-4))
    ref = rms_norm_ref(x, w, eps)
    padded = torch.full((rows, hidden + pad), float("nan"), dtype=dtype, device=device)
    if layout == "in_place":
        out = x
    else:
        out = padded[:, :hidden] if layout == "strided" else padded[:, :hidden].contiguous()
    torch.ops._C.rms_norm(out, x, w, eps)
    torch.testing.assert_close(out, ref, atol=TOL[dtype][0], rtol=TOL[dtype][1])
    assert padded[:, hidden:].isnan().all()


def test_strided_input(device):
    base = torch.randn(13, 1100, dtype=torch.bfloat16, device=device)
    x = base[:, 50 : 50 + 1027]
    w = torch.randn(1027, dtype=torch.bfloat16, device=device)
    out = torch.full((13, 1027), float("nan"), dtype=torch.bfloat16, device=device)
    torch.ops._C.rms_norm(out, x, w, 1e-5)
    torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-5), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda o, x, w: (o, x, w[:-1], 1e-6), r"weight must have shape \[64\]"),
        (lambda o, x, w: (o, x, w.float(), 1e-6), "weight must be"),
        (lambda o, x, w: (o[:-1], x, w, 1e-6), "result must have the shape"),
        (lambda o, x, w: (o, x, w, -1.0), "epsilon"),
        (lambda o, x, w: (o, x.double(), w, 1e-6), "float32, float16 or bfloat16"),
    ],
)
def test_rejects_bad_input(device, bad, match):
    x = torch.randn(4, 64, dtype=torch.float16, device=device)
    w = torch.randn(64, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match=match):
        torch.ops._C.rms_norm(*bad(torch.empty_like(x), x, w))


def test_empty_inputs_are_a_no_op(device):
    for shape in [(0, 64), (2, 0, 64), (0, 3, 64)]:
        x = torch.randn(*shape, device=device)
        w = torch.randn(64, device=device)
        torch.ops._C.rms_norm(torch.empty_like(x), x, w, 1e-6)
        torch.ops._C.fused_add_rms_norm(x, torch.randn_like(x), w, 1e-6)


def test_rms_norm_in_place(device):
    # A row is read whole before it is written: result may be input itself.
    x = torch.randn(37, 769, device=device)
    w = torch.randn(769, device=device)
    ref = rms_norm_ref(x, w, 1e-6)
    torch.ops._C.rms_norm(x, x, w, 1e-6)
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(x, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    "call, match",
    [
        # Both arguments are written: the same tensor, or rows over each other, would mix them.
        (lambda x, w: torch.ops._C.fused_add_rms_norm(x, x, w, 1e-6), "input shares memory"),
        (
            lambda x, w: torch.ops._C.fused_add_rms_norm(x[:8], x[4:12], w, 1e-6),
            "input shares memory with residual",
        ),
        (
            lambda x, w: torch.ops._C.rms_norm(x[1:], x[:-1], w, 1e-6),
            "result shares memory with input",
        ),
        (
            lambda x, w: torch.ops._C.rms_norm(
                torch.zeros(1, 64, device=x.device).expand(16, 64), x, w, 1e-6
            ),
            "rows that share memory",
        ),
        (
            lambda x, w: torch.ops._C.rms_norm(x[:1], x[1:2], x[0], 1e-6),
            "result shares memory with weight",
        ),
    ],
)
def test_outputs_that_overlap_are_rejected(device, call, match):
    x = torch.randn(16, 64, device=device)
    w = torch.randn(64, device=device)
    with pytest.raises(RuntimeError, match=match):
        call(x, w)


def test_opcheck(device):
    x = torch.randn(5, 83, device=device)
    w = torch.randn(83, device=device)
    torch.library.opcheck(torch.ops._C.rms_norm.default, (torch.empty_like(x), x, w, 1e-6))
    torch.library.opcheck(
        torch.ops._C.fused_add_rms_norm.default, (x.clone(), torch.randn_like(x), w, 1e-6)
    )


def test_torch_compile(device):
    def f(x, residual, w):
        torch.ops._C.fused_add_rms_norm(x, residual, w, 1e-6)
        return x + 1, residual

    x = torch.randn(6, 96, device=device)
    residual = torch.randn_like(x)
    w = torch.randn(96, device=device)
    ref_out, ref_res = fused_add_rms_norm_ref(x, residual, w, 1e-6)
    out, res = torch.compile(f, fullgraph=True, backend="aot_eager")(x.clone(), residual.clone(), w)
    torch.testing.assert_close(out, ref_out + 1)
    torch.testing.assert_close(res, ref_res)


def test_offsets_past_int32(device, far_view):
    # Rows 2^30 elements apart: the last row's offsets pass 2^31, so the GPU kernels take their
    # 64-bit-index path (the 32-bit one needs every offset of the launch to fit an int).
    hidden = 8192
    far = far_view((3, hidden), ((1 << 30) + 64, 1))
    far.copy_(torch.randn(3, hidden, device=device))
    w = torch.randn(hidden, dtype=torch.bfloat16, device=device)
    out = torch.full((3, hidden), float("nan"), dtype=torch.bfloat16, device=device)
    torch.ops._C.rms_norm(out, far, w, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(far, w, 1e-6), atol=1.6e-2, rtol=1.6e-2)
    # The residual is the far tensor here.
    x = torch.randn(3, hidden, dtype=torch.bfloat16, device=device)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, far, w, 1e-6)
    torch.ops._C.fused_add_rms_norm(x, far, w, 1e-6)
    torch.testing.assert_close(far, ref_residual, atol=0, rtol=0)
    torch.testing.assert_close(x, ref_out, atol=1.6e-2, rtol=1.6e-2)
