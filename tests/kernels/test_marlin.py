"""Marlin-style W4A16 GEMM and its repacks. The repacks are checked bit-exactly by unpacking our
layout (on every device the build serves, the CPU included); the GEMM (CUDA only) against the
fp32 reference a @ dequant(w), by norm-wise relative error."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from narrowed import left_out, skip_left_out

import aphrodite_ext
from aphrodite_ext.ops import marlin

# Norm-wise relative error bounds of the GEMM against the fp32 reference.
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
WEIGHT_TYPES = ["uint4b8", "uint4"]
GROUPS = [32, 64, 128, -1]
# (K, N): odd multiples of the tile (16 x 64) up to the sizes of large layers.
REPACK_SHAPES = [(16, 64), (48, 192), (208, 320), (1040, 704), (4096, 4096)]


@pytest.fixture(autouse=True)
def _load():
    aphrodite_ext.load("_C")


def random_codes(k, n, device, gen=None):
    return torch.randint(0, 16, (k, n), dtype=torch.int32, generator=gen).to(device)


# --- repack ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", REPACK_SHAPES)
def test_gptq_repack_exact(device, shape):
    k, n = shape
    codes = random_codes(k, n, device)
    packed = torch.ops._C.gptq_marlin_repack(
        marlin.pack_gptq(codes), torch.empty(0, dtype=torch.int32, device=device), k, n, 4
    )
    assert packed.shape == (k // 16, 2 * n) and packed.dtype == torch.int32
    assert torch.equal(marlin.unpack_marlin(packed, k, n), codes)


@pytest.mark.parametrize("shape", REPACK_SHAPES)
def test_awq_repack_exact(device, shape):
    k, n = shape
    codes = random_codes(k, n, device)
    qweight = marlin.pack_awq(codes)
    assert torch.equal(marlin.unpack_awq(qweight), codes)
    packed = torch.ops._C.awq_marlin_repack(qweight, k, n, 4)
    assert torch.equal(marlin.unpack_marlin(packed, k, n), codes)


@pytest.mark.parametrize("perm_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(48, 192), (1040, 704)])
def test_gptq_repack_act_order(device, shape, perm_dtype):
    k, n = shape
    codes = random_codes(k, n, device)
    perm = torch.randperm(k).to(device=device, dtype=perm_dtype)
    packed = torch.ops._C.gptq_marlin_repack(marlin.pack_gptq(codes), perm, k, n, 4)
    assert torch.equal(marlin.unpack_marlin(packed, k, n), codes[perm.long()])


def test_layout_is_fragment_order(device):
    # One tile, checked against the mma.sync m16n8k16 B-fragment layout directly: lane l's word
    # w, nibble pair (j, j + 4) must hold B[k][n] for n = 8 * (2w + j % 2) + l // 4 and
    # k = 2 (l % 4) + 8 (j // 2) + {0, 1}.
    codes = random_codes(16, 64, device)
    packed = torch.ops._C.awq_marlin_repack(marlin.pack_awq(codes), 16, 64, 4).cpu()
    words = packed.view(32, 4)
    c = codes.cpu()
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for w in range(4):
            word = int(words[lane, w]) & 0xFFFFFFFF
            for j in range(4):
                n = 8 * (2 * w + j % 2) + g
                k = 2 * t + 8 * (j // 2)
                assert (word >> (4 * j)) & 0xF == c[k, n]
                assert (word >> (4 * (j + 4))) & 0xF == c[k + 1, n]


def test_kernel_fragment_path_emulated(device):
    # The GEMM kernel's index math for one warp and one k16 step, restated in Python and checked
    # against the PTX ISA's m16n8k16 fragment definitions: A through the XOR-swizzled shared
    # memory row and ldmatrix.x4, B through our packed layout and the (word >> 4j) & 0x000f000f
    # nibble-pair extraction, paired into the mma's {b0b1, b2b3} registers as the kernel does.
    k, n = 16, 64
    codes = random_codes(k, n, device)
    words = torch.ops._C.awq_marlin_repack(marlin.pack_awq(codes), k, n, 4).cpu().view(32, 4)
    a = torch.randn(16, 16)
    smem = torch.full((16 * 64,), float("nan"))  # one stage's A rows: 64 elements each
    for row in range(16):
        for chunk in range(2):
            at = row * 64 + ((chunk ^ (row & 7)) * 8)
            smem[at : at + 8] = a[row, chunk * 8 : chunk * 8 + 8]

    def ldmatrix_address(lane):  # as compute_stage computes it for kk = 0, mi = 0, warp_m = 0
        mat = lane // 8
        row = lane % 8 + 8 * (mat & 1)
        return row * 64 + (((mat >> 1) ^ (row & 7)) * 8)

    a_frag = torch.empty(16, 16)
    b_frag = torch.empty(8, 16, 8)  # [sub-tile, k, n]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        # ldmatrix.x4: register i of `lane` = row lane // 4 of matrix i, whose row r address
        # came from lane 8i + r; elements 2 (lane % 4) and + 1.
        regs = [smem[ldmatrix_address(8 * i + g) + 2 * t :][:2] for i in range(4)]
        # PTX A fragment: a0a1 (g, 2t..), a2a3 (g + 8, 2t..), a4a5 (g, 2t + 8..), a6a7 (g + 8, ..)
        a_frag[g, 2 * t : 2 * t + 2] = regs[0]
        a_frag[g + 8, 2 * t : 2 * t + 2] = regs[1]
        a_frag[g, 2 * t + 8 : 2 * t + 10] = regs[2]
        a_frag[g + 8, 2 * t + 8 : 2 * t + 10] = regs[3]
        for w in range(4):
            word = int(words[lane, w]) & 0xFFFFFFFF
            pairs = []
            for j in range(4):
                bits = (word >> (4 * j)) & 0x000F000F
                pairs.append((bits & 0xF, bits >> 16))  # (low half, high half)
            # mma for sub-tile 2w takes (b[0], b[2]); for 2w + 1, (b[1], b[3]).
            for tile, (r0, r1) in (
                (2 * w, (pairs[0], pairs[2])),
                (2 * w + 1, (pairs[1], pairs[3])),
            ):
                # PTX B fragment: b0b1 (k = 2t, 2t + 1; n = g), b2b3 (k = 2t + 8, 2t + 9)
                b_frag[tile, 2 * t, g], b_frag[tile, 2 * t + 1, g] = r0
                b_frag[tile, 2 * t + 8, g], b_frag[tile, 2 * t + 9, g] = r1
    assert torch.equal(a_frag, a)
    b_full = b_frag.permute(1, 0, 2).reshape(16, 64)
    assert torch.equal(b_full, codes.cpu().float())


@pytest.mark.parametrize(
    "dtype, magic_bits, magic", [(torch.float16, 0x6400, 1024.0), (torch.bfloat16, 0x4300, 128.0)]
)
def test_dequant_magic_numbers(dtype, magic_bits, magic):
    # The kernel ORs a 4-bit code into the mantissa of `magic` (marlin_gemm.cuh Traits) and
    # subtracts magic + zero: both steps must be exact in the activation dtype.
    code = torch.arange(16, dtype=torch.int32)
    value = (code | magic_bits).to(torch.int16).view(dtype)
    assert torch.equal(value.float(), magic + code.float())
    for zero in range(16):
        sub = torch.tensor(magic + zero, dtype=dtype)
        assert torch.equal((value - sub).float(), code.float() - zero)


# The kernel's per-word dequantization (marlin_gemm.cuh compute_stage, Traits, zero_pair),
# restated on bit patterns: a half pair is one uint32, low half first.
DEQUANT_BITS = {
    # dtype: (magic pair, high-nibble FMA?, 1/16 pair, high bias pair)
    torch.float16: (0x64006400, True, 0x2C002C00, 0xD400D400),
    torch.bfloat16: (0x43004300, False, 0, 0),
}


def _halves(words: torch.Tensor, dtype) -> torch.Tensor:
    """uint32 bit patterns (int64 tensor) -> float64 [..., 2] (low half, high half)."""
    lanes = torch.stack([words & 0xFFFF, (words >> 16) & 0xFFFF], -1)
    return lanes.to(torch.int32).to(torch.int16).view(dtype).double()


def _round(x: torch.Tensor, dtype) -> torch.Tensor:
    """One correctly rounded result of an exact float64 value in dtype (fp16 / bf16)."""
    return x.to(dtype).double()


def _zero_pair(j: int, zero: torch.Tensor, dtype) -> torch.Tensor:
    magic, fma, _, high_bias = DEQUANT_BITS[dtype]
    if fma and j % 2 == 1:
        return zero * 0x100010 + high_bias
    return zero * 0x10001 + magic


def _kernel_dequant(words: torch.Tensor, zeros: list, dtype) -> list:
    """The four register pairs (j = 0..3: nibbles j and j + 4) before the scale, as float64
    [..., 2], computed as the kernel does; zeros[j % 2] are the zero points of their sub-tile."""
    magic, fma, sixteenth, _ = DEQUANT_BITS[dtype]
    out = []
    for j in range(4):
        zsub = _halves(_zero_pair(j, zeros[j % 2], dtype), dtype)
        if fma:
            src = words if j < 2 else words >> 8
            mask = 0x00F000F0 if j % 2 else 0x000F000F
            v = _halves((src & mask) | magic, dtype)
            if j % 2:  # HFMA2: one rounding of v * 1/16 + zsub
                out.append(_round(v * _halves(torch.tensor(sixteenth), dtype) + zsub, dtype))
            else:
                out.append(_round(v - zsub, dtype))
        else:
            v = _halves(((words >> (4 * j)) & 0x000F000F) | magic, dtype)
            out.append(_round(v - zsub, dtype))
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequant_bit_tricks_exact(dtype):
    # Every 16-bit half word in both lanes, with every zero point: the kernel's registers hold
    # code - zero exactly for the nibble pairs (j, j + 4), as the plain formula
    # ((word >> 4j) & 0x000f000f | magic) - (magic + zero) does.
    low = torch.arange(1 << 16, dtype=torch.int64)
    high = torch.randperm(1 << 16, generator=torch.Generator().manual_seed(0)).to(torch.int64)
    words = (low | (high << 16)).view(1, -1)
    zero_even = torch.arange(16).view(16, 1)  # all zero points at once, [16, 1] x [1, 2^16]
    zeros = [zero_even, (zero_even * 7 + 3) % 16]
    regs = _kernel_dequant(words, zeros, dtype)
    for j in range(4):
        codes = torch.stack([(words >> (4 * j)) & 0xF, (words >> (4 * (j + 4))) & 0xF], -1)
        assert torch.equal(regs[j], (codes - zeros[j % 2].unsqueeze(-1)).double()), j
    # The constants themselves.
    for zero in range(16):
        z = torch.tensor(zero)
        magic_value = 1024.0 if dtype == torch.float16 else 128.0
        assert _halves(_zero_pair(0, z, dtype), dtype).tolist() == [magic_value + zero] * 2
        if DEQUANT_BITS[dtype][1]:
            assert _halves(_zero_pair(1, z, dtype), dtype).tolist() == [-(64.0 + zero)] * 2
    if dtype == torch.float16:
        assert _halves(torch.tensor(0x2C002C00), dtype).tolist() == [0.0625] * 2


def test_scale_pairs_ldmatrix_trans():
    # The grouped kernels load a warp's 8 scales (column 8j + g of its 64, j = 0..7) with one
    # ldmatrix.x4.trans from the block's scale row: lane l gives the address of row
    # 2 (l // 8) + (l & 1) of the 8 x 8 matrix [j][g] (s_lane in marlin_gemm.cuh); .trans gives
    # lane (g, t) of matrix i its stored rows 2t and 2t + 1 at column g. Register i must be
    # {s(2i), s(2i + 1)} of column g; the zero points (set_zeros) are nibble g of word j.
    block_n = 256
    scales = torch.randn(block_n)
    zero_codes = torch.randint(0, 16, (1, block_n), dtype=torch.int32)
    zero_words = marlin.pack_plain(zero_codes).view(-1)
    for warp_n in range(block_n // 64):
        addresses = [warp_n * 64 + (2 * (lane // 8) + (lane & 1)) * 8 for lane in range(32)]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for i in range(4):
                rows = [addresses[8 * i + r] for r in range(8)]  # matrix i's stored rows
                pair = (scales[rows[2 * t] + g], scales[rows[2 * t + 1] + g])
                base = warp_n * 64
                assert pair == (scales[base + 16 * i + g], scales[base + 16 * i + 8 + g])
            zrow = zero_words[warp_n * 8 : warp_n * 8 + 8]
            for j in range(8):
                zero = (int(zrow[j]) >> (4 * g)) & 0xF
                assert zero == int(zero_codes[0, warp_n * 64 + 8 * j + g])


def test_awq_zero_points(device):
    codes = random_codes(3, 192, device)
    plain = marlin.awq_zeros_to_marlin(marlin.pack_awq(codes))
    shifts = 4 * torch.arange(8, device=device, dtype=torch.int32)
    assert torch.equal(((plain.unsqueeze(-1) >> shifts) & 0xF).reshape(3, 192), codes)


def test_repack_bad_inputs(device):
    k, n = 48, 192
    q = marlin.pack_gptq(random_codes(k, n, device))
    empty = torch.empty(0, dtype=torch.int32, device=device)
    op = torch.ops._C.gptq_marlin_repack
    with pytest.raises(RuntimeError, match="only num_bits=4"):
        op(q, empty, k, n, 8)
    with pytest.raises(RuntimeError, match="size_k must be a positive multiple of 16"):
        op(q, empty, 40, n, 4)
    with pytest.raises(RuntimeError, match="size_n must be a positive multiple of 64"):
        op(q, empty, k, 96, 4)
    with pytest.raises(RuntimeError, match="must have shape"):
        op(q, empty, 2 * k, n, 4)
    with pytest.raises(RuntimeError, match="must be int32"):
        op(q.float(), empty, k, n, 4)
    with pytest.raises(RuntimeError, match="perm must be empty or have shape"):
        op(q, torch.arange(k - 1, dtype=torch.int32, device=device), k, n, 4)
    with pytest.raises(RuntimeError, match="only num_bits=4"):
        torch.ops._C.awq_marlin_repack(marlin.pack_awq(random_codes(k, n, device)), k, n, 8)
    with pytest.raises(RuntimeError, match="AWQ qweight"):
        torch.ops._C.awq_marlin_repack(q, k, n, 4)
    # perm is checked on every backend (a repack runs once, at load time), before the int32
    # narrowing that would wrap 2^32 to row 0.
    with pytest.raises(RuntimeError, match="is not a row index"):
        op(q, torch.full((k,), k, dtype=torch.int32, device=device), k, n, 4)
    far = torch.arange(k, device=device)
    far[0] = 2**32
    with pytest.raises(RuntimeError, match=r"perm\[0\] = 4294967296 is not a row index"):
        op(q, far, k, n, 4)
    twice = torch.arange(k, dtype=torch.int32, device=device)
    twice[1] = 0
    with pytest.raises(RuntimeError, match="must be a permutation"):
        op(q, twice, k, n, 4)
    # A meta tensor beside real ones would return an uninitialised result.
    with pytest.raises(RuntimeError, match="meta"):
        op(q, torch.arange(k, device="meta"), k, n, 4)


def test_repack_opcheck(device):
    k, n = 48, 192
    q = marlin.pack_gptq(random_codes(k, n, device))
    perm = torch.randperm(k, dtype=torch.int32).to(device)
    torch.library.opcheck(torch.ops._C.gptq_marlin_repack.default, (q, perm, k, n, 4))
    qa = marlin.pack_awq(random_codes(k, n, device))
    torch.library.opcheck(torch.ops._C.awq_marlin_repack.default, (qa, k, n, 4))


def test_repack_compile(device):
    k, n = 48, 192
    qa = marlin.pack_awq(random_codes(k, n, device))
    fn = torch.compile(lambda q: torch.ops._C.awq_marlin_repack(q, k, n, 4), fullgraph=True)
    assert torch.equal(fn(qa), torch.ops._C.awq_marlin_repack(qa, k, n, 4))


# --- GEMM -----------------------------------------------------------------------------------


def require_cuda(device):
    if device != "cuda":
        pytest.skip("gptq_marlin_gemm runs on CUDA only")


def make_layer(k, n, dtype, weight_type, group_size, act_order, device, seed=0):
    """A quantized layer: the op's arguments and the dequantized fp32 weight."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(k, n, generator=gen).to(device) * 0.05
    q = marlin.quantize_weights(w, weight_type, group_size, act_order, dtype, gen)
    perm = q["perm"] if act_order else None
    packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), perm, k, n)
    zeros = marlin.pack_plain(q["zeros"]) if weight_type == "uint4" else None
    return {
        "b_q_weight": packed,
        "b_scales": q["scales"],
        "b_zeros": zeros,
        "g_idx": q["g_idx"] if act_order else None,
        "perm": perm,
        "w_ref": q["w_ref"],
    }


def rel_error(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def run_gemm(a, layer, weight_type, bias=None, workspace=None):
    """The op on a layer; skips what a narrowed build left out."""
    ws = marlin.make_workspace(a.device) if workspace is None else workspace
    try:
        return marlin.gptq_marlin_gemm(
            a,
            layer["b_q_weight"],
            layer["b_scales"],
            ws,
            weight_type,
            b_zeros=layer["b_zeros"],
            g_idx=layer["g_idx"],
            perm=layer["perm"],
            bias=bias,
        )
    except RuntimeError as e:
        # A build narrowed by the generator options: a combination, or a block shape that
        # APHRODITE_MARLIN_CONFIG forces, that it left out; or a forced sm_90a shape elsewhere.
        if left_out(e) or "sm_90 only" in str(e):
            pytest.skip(str(e).splitlines()[0])
        raise


def check_gemm(m, k, n, dtype, weight_type, group_size, act_order, device, bias=False):
    layer = make_layer(k, n, dtype, weight_type, group_size, act_order, device)
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(n, dtype=dtype, device=device) if bias else None
    out = run_gemm(a, layer, weight_type, bias=b)
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.isfinite(out).all(), "some outputs were not written or overflowed"
    ref = marlin.gemm_ref(a, layer["w_ref"], b)
    err = rel_error(out, ref)
    assert err < TOL[dtype], f"relative error {err:.3g} >= {TOL[dtype]}"


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 24, 33, 64, 128, 257, 1024])
@pytest.mark.parametrize("kn", [(384, 192), (1152, 704), (4096, 4096)])
def test_gemm_sizes(device, dtype, weight_type, m, kn):
    require_cuda(device)
    check_gemm(m, *kn, dtype, weight_type, 128, False, device)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("m", [1, 33, 257])
def test_gemm_groups(device, dtype, weight_type, group_size, act_order, m):
    require_cuda(device)
    if act_order and group_size == -1:
        pytest.skip("act-order needs groups")
    check_gemm(m, 1152, 320, dtype, weight_type, group_size, act_order, device)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("group_size", [48, 96, 144])
@pytest.mark.parametrize("m", [1, 33])
def test_gemm_group_not_power_of_two(device, dtype, weight_type, group_size, m):
    # The kernel finds a k row's group by a multiply-high with launch-time constants: group
    # sizes other than powers of two (multiples of 16, >= 32) take the same path.
    require_cuda(device)
    check_gemm(m, 1152, 320, dtype, weight_type, group_size, False, device)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 16, 29, 64])
@pytest.mark.parametrize("kn", [(8192, 8192), (8192, 28672), (28672, 8192)])
def test_gemm_large(device, dtype, m, kn):
    require_cuda(device)
    check_gemm(m, *kn, dtype, "uint4b8", 128, False, device)


@pytest.mark.parametrize("k", [16, 208, 1040])  # K not a multiple of the 64-deep slice
@pytest.mark.parametrize("m", [1, 33])
def test_gemm_k_tail_per_channel(device, k, m):
    require_cuda(device)
    check_gemm(m, k, 192, torch.float16, "uint4", -1, False, device)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_gemm_bias(device, weight_type):
    require_cuda(device)
    check_gemm(7, 384, 192, torch.bfloat16, weight_type, 64, False, device, bias=True)


def test_gemm_strided_a_and_workspace_reuse(device):
    require_cuda(device)
    k, n = 1024, 576
    layer = make_layer(k, n, torch.float16, "uint4b8", 128, False, device)
    base = torch.randn(5, k + 64, dtype=torch.float16, device=device)
    a = base[:, 64:]  # row stride k + 64, a multiple of 8 elements
    ws = marlin.make_workspace(device)
    ref = marlin.gemm_ref(a, layer["w_ref"])
    first = run_gemm(a, layer, "uint4b8", workspace=ws)
    assert torch.count_nonzero(ws) == 0, "split-K counters must be left at zero"
    second = run_gemm(a, layer, "uint4b8", workspace=ws)
    assert rel_error(first, ref) < TOL[torch.float16]
    assert torch.equal(first, second), "the split-K reduction must be deterministic"


def test_gemm_small_workspace_does_not_split(device):
    # vLLM passes one counter per SM; with fewer counters than tiles the kernel must not split.
    require_cuda(device)
    layer = make_layer(4096, 1024, torch.float16, "uint4b8", 128, False, device)
    a = torch.randn(3, 4096, dtype=torch.float16, device=device)
    ws = torch.zeros(1, dtype=torch.int32, device=device)
    out = run_gemm(a, layer, "uint4b8", workspace=ws)
    assert rel_error(out, marlin.gemm_ref(a, layer["w_ref"])) < TOL[torch.float16]


GENERATOR = Path(__file__).resolve().parents[2] / "codegen" / "marlin.py"


def describe_generator(*options: str, archs: str = "9.0a") -> subprocess.CompletedProcess:
    """codegen/marlin.py --describe under `options` (KEY=VALUE): on success its stdout is the JSON
    of the files it would write and the values each option accepts (it writes nothing)."""
    cmd = [sys.executable, str(GENERATOR), "--out-dir", "unused", "--archs", archs, "--describe"]
    for opt in options:
        cmd += ["--option", opt]
    return subprocess.run(cmd, capture_output=True, text=True)


def _shape_choices() -> list[str]:
    proc = describe_generator()
    if proc.returncode != 0:
        raise RuntimeError(f"codegen/marlin.py --describe failed:\n{proc.stderr}")
    return json.loads(proc.stdout)["choices"]["shapes"]


# Every block shape of the grid (the sm_90a wgmma and TMA-fed blocks are built for 9.0a only, the
# k2 twins only where the shapes option names them; unbuilt ones skip).
BLOCK_SHAPES = _shape_choices()


def check_forced(device, monkeypatch, config, n, m, weight_type="uint4", layer=None, a=None):
    """The op under APHRODITE_MARLIN_CONFIG=config at K = 1104 (17.25 slices of 64: a k tail),
    group size 48 (with zero points for uint4): exact, and the split-K counters left at zero."""
    require_cuda(device)
    if layer is None:
        layer = make_layer(1104, n, torch.float16, weight_type, 48, False, device)
    if a is None:
        a = torch.randn(m, 1104, dtype=torch.float16, device=device)
    ws = marlin.make_workspace(device)
    monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", config)
    out = run_gemm(a, layer, weight_type, workspace=ws)
    assert torch.isfinite(out).all()
    assert rel_error(out, marlin.gemm_ref(a, layer["w_ref"])) < TOL[torch.float16]
    assert torch.count_nonzero(ws) == 0, "split-K counters must be left at zero"
    return out, lambda: run_gemm(a, layer, weight_type, workspace=ws)


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("splits", [None, 1, 2, 5, 64])
@pytest.mark.parametrize("m", [1, 33, 130])
def test_gemm_forced_config(device, monkeypatch, shape, splits, m):
    # Every configuration the tuning override (and so the dispatch) can pick must be exact,
    # including splits that leave some k slices empty or exceed the slices (clamped); the k
    # tail lands in the last split.
    check_forced(device, monkeypatch, shape + ("" if splits is None else f":{splits}"), 704, m)


@pytest.mark.parametrize("shape", ["m16n256", "m64n256", "m16n256t", "m64n256w"])
@pytest.mark.parametrize("n", [768, 28672])
@pytest.mark.parametrize("m", [1, 33])
def test_gemm_split_through_global_memory(device, monkeypatch, shape, n, m):
    # 12 splits (more than a cluster takes) sum through global memory: at N = 768 and M = 33 (3
    # column tiles, 36 blocks a row of blocks, resident at once; more than 8 rows a block)
    # every block sums a share of its tile once all of the tile's blocks have written theirs; at
    # M = 1, or N = 28672 (1344 blocks a row, more than GPUs of today hold at once), the last
    # block of a tile to arrive sums it all. Both in slot order: exact, deterministic, and the
    # counters left at zero.
    out, again = check_forced(device, monkeypatch, f"{shape}:12", n, m)
    assert torch.equal(out, again()), "not deterministic"


@pytest.mark.parametrize("shape", ["m16n256", "m16n256t", "m32n256w", "m64n256w"])
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("m, n", [(1, 768), (33, 768), (130, 704)])
def test_gemm_split_sums_agree(device, monkeypatch, shape, weight_type, m, n):
    # Split 4 at N = 768 or 704 (3 column tiles, the last of 704 partial: 12 blocks a row of
    # blocks, in clusters of 4, all held at once; at M = 130 several rows of blocks, the last
    # partial): each of the three ways a split tile is summed, forced (the call raises where the
    # launch would take another way), is exact and leaves the counters at zero, and, all three
    # summing the slots in slot order, they give the same bits.
    require_cuda(device)
    layer = make_layer(1104, n, torch.float16, weight_type, 48, False, device)
    a = torch.randn(m, 1104, dtype=torch.float16, device=device)
    sums = ["spread", "last"]
    if torch.cuda.get_device_capability(device) >= (9, 0):
        sums.append("cluster")
    outs = {}
    for how in sums:
        outs[how], _ = check_forced(
            device, monkeypatch, f"{shape}:4/{how}", n, m, weight_type, layer, a
        )
    for how in sums[1:]:
        assert torch.equal(outs[how], outs[sums[0]]), f"the {how} sum differs from the spread sum"


@pytest.mark.parametrize(
    "config, message",
    [
        ("m16n256:4/everywhere", "is not 'm<rows>n<cols>"),
        ("m16n256:sk/spread", "is not 'm<rows>n<cols>"),
        ("m16n256/spread", "is not 'm<rows>n<cols>"),
        ("m16n256:1/last", "names a split sum, but the plan has 1 split"),
    ],
)
def test_gemm_split_sum_config_errors(device, monkeypatch, config, message):
    require_cuda(device)
    layer = make_layer(1104, 768, torch.float16, "uint4b8", 48, False, device)
    a = torch.randn(5, 1104, dtype=torch.float16, device=device)
    monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", config)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        run_gemm(a, layer, "uint4b8")


# Values a split tile's counter may hold at launch that are not zero: 2^20 and -1 (never zeroed);
# 1 and 3 (untagged counts: with 4 splits, by its count alone the block that finds 3 is the last,
# which the last-block sum caught, before the launch's tag joined the count, only where a later
# block arrived before the early one's reset); one block's arrival of a launch tagged 2^20 - 1
# (another stream's); and one block's arrival of the child's first launch (tag 1, step 4097),
# which a launch stopped midway leaves for the next.
DIRTY_COUNTS = [1 << 20, -1, 1, 3, -4095, 4097]  # -4095: (2^20 - 1) << 12 | 1 as an int32


@pytest.mark.parametrize("dirt", DIRTY_COUNTS)
@pytest.mark.parametrize("how", ["spread", "last"])
def test_gemm_dirty_workspace_fails_loudly(device, how, dirt):
    # A workspace whose counters are not zero (shared by GEMMs on two streams, or never zeroed)
    # fails the GEMM (an illegal-address fault, marlin_gemm.cuh fail_launch: a block's arrival
    # finds a count that is not its launch's), where it would otherwise sum tiles wrongly (the
    # last block) or wait for ever (spread). In a child process: the fault leaves its CUDA
    # context unusable.
    require_cuda(device)
    child = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import test_marlin as t
from aphrodite_ext.ops import marlin
t.aphrodite_ext.load("_C")
try:
    layer = t.make_layer(1104, 768, torch.float16, "uint4b8", 48, False, {device!r})
    a = torch.randn(33, 1104, dtype=torch.float16, device={device!r})
    ws = marlin.make_workspace({device!r})
    os.environ["APHRODITE_MARLIN_CONFIG"] = "m16n256:4/{how}"
    t.run_gemm(a, layer, "uint4b8", workspace=ws)
    torch.cuda.synchronize()
except BaseException as e:
    if type(e).__name__ == "Skipped":  # what a narrowed build left out (run_gemm)
        print("SKIP:", e, flush=True)
        sys.exit(0)
    raise
print("clean workspace: ok", flush=True)
ws.fill_({dirt})
t.run_gemm(a, layer, "uint4b8", workspace=ws)
torch.cuda.synchronize()
print("dirty workspace: no error", flush=True)
"""
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=300
    )
    output = proc.stdout + proc.stderr
    if "SKIP:" in proc.stdout:
        pytest.skip(proc.stdout.split("SKIP:", 1)[1].strip().splitlines()[0])
    assert "clean workspace: ok" in output, output
    assert proc.returncode != 0 and "dirty workspace: no error" not in output, output
    assert "illegal memory access" in output, output


# Every block shape but m32n256k2 (m64n256k2 takes the k-split blocks through stream-K).
STREAM_K_SHAPES = [shape for shape in BLOCK_SHAPES if shape != "m32n256k2"]


@pytest.mark.parametrize("shape", STREAM_K_SHAPES)
@pytest.mark.parametrize("blocks", [None, 1, 3, 7, 40, 10_000])
@pytest.mark.parametrize("m", [1, 33, 130])
def test_gemm_stream_k(device, monkeypatch, shape, blocks, m):
    # Stream-K (":sk[<blocks>]"): <blocks> blocks per row of blocks walk the (column tile, k
    # slice) units in equal ranges across tile boundaries; 11 column tiles of 18 slices (a k tail
    # in each tile's last slice) over 1, 3, 7 or 40 blocks split tiles at uneven points, over as
    # many blocks as fit (None) or more than there are units (clamped). Exact, deterministic,
    # and the counters left at zero.
    config = shape + ":sk" + ("" if blocks is None else str(blocks))
    out, again = check_forced(device, monkeypatch, config, 2816, m)  # 11 tiles of 256 columns
    assert torch.equal(out, again()), "not deterministic"


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("kn", [(16, 64), (96, 320), (1152, 704), (4096, 4096)])
def test_gemm_stream_k_groups(device, monkeypatch, dtype, weight_type, group_size, kn):
    # Every combination's stream-K path, at K below one slice, with a k tail, and at a size
    # where the resident blocks outnumber the column tiles; the decode and the 64-row block, and
    # the sm_90a blocks (wgmma, TMA-fed decode; sm_90a builds on sm_90 devices) with rows past M
    # in their last block.
    require_cuda(device)
    k, n = kn
    if group_size > 0 and k % group_size:
        pytest.skip("K is not a multiple of the group size")
    layer = make_layer(k, n, dtype, weight_type, group_size, False, device)
    ws = marlin.make_workspace(device)
    cases = (
        (5, "m16n256"),
        (61, "m64n256"),
        (29, "m32n256w"),
        (61, "m64n256w"),
        (141, "m128n256w"),
        (9, "m16n256t"),
    )
    for m, shape in cases:
        a = torch.randn(m, k, dtype=dtype, device=device)
        monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", shape + ":sk")
        try:
            out = run_gemm(a, layer, weight_type, workspace=ws)  # skips a shape left out
        except pytest.skip.Exception:
            if shape.endswith(("w", "t")):
                continue  # no sm_90a blocks in this build or on this device
            raise
        assert rel_error(out, marlin.gemm_ref(a, layer["w_ref"])) < TOL[dtype], shape
        assert torch.count_nonzero(ws) == 0, "split-K counters must be left at zero"


def test_gemm_stream_k_small_workspace(device, monkeypatch):
    # With fewer counters than tiles stream-K must fall back to one block per tile.
    require_cuda(device)
    layer = make_layer(4096, 1024, torch.float16, "uint4", 128, False, device)
    a = torch.randn(3, 4096, dtype=torch.float16, device=device)
    ws = torch.zeros(1, dtype=torch.int32, device=device)
    monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", "m16n256:sk")
    out = run_gemm(a, layer, "uint4", workspace=ws)
    assert rel_error(out, marlin.gemm_ref(a, layer["w_ref"])) < TOL[torch.float16]
    assert torch.count_nonzero(ws) == 0


@pytest.mark.parametrize(
    "config",
    [
        "m16",
        "n256",
        "m17n256",
        "m16n256:2x",
        "fast",
        "m64n256k",
        "m64n256k0",
        "m64n256k2x",
        "m16n256:sk0",
        "m16n256:skx",
        "m16n256:s",
        "m64n256w2",
        "m64n256kw",
    ],
)
def test_gemm_forced_config_bad(device, monkeypatch, config):
    require_cuda(device)
    args = built_gemm_args(device)
    monkeypatch.setenv("APHRODITE_MARLIN_CONFIG", config)
    with pytest.raises(RuntimeError, match="APHRODITE_MARLIN_CONFIG"):
        torch.ops._C.gptq_marlin_gemm(*args)


def skip_if_left_out(args):
    """Skips the test where a narrowed build left out the combination of `args`."""
    with skip_left_out():
        torch.ops._C.gptq_marlin_gemm(*args)


def built_gemm_args(device):
    """gemm_args for a combination this build holds (a narrowed build may hold only one)."""
    for dtype, weight_type in [(torch.float16, "uint4b8"), (torch.float16, "uint4")]:
        args = gemm_args(device, dtype, weight_type)
        try:
            torch.ops._C.gptq_marlin_gemm(*args)
            return args
        except RuntimeError as e:
            if not left_out(e):
                raise
    pytest.skip("this build holds neither fp16 uint4b8 nor fp16 uint4")


def gemm_args(device, dtype=torch.float16, weight_type="uint4b8", m=5, k=256, n=128):
    layer = make_layer(k, n, dtype, weight_type, 128, False, device)
    a = torch.randn(m, k, dtype=dtype, device=device)
    return [
        a,
        None,
        layer["b_q_weight"],
        None,
        layer["b_scales"],
        None,
        layer["b_zeros"],
        None,
        None,
        marlin.make_workspace(device),
        marlin.WEIGHT_TYPE_IDS[weight_type],
        m,
        n,
        k,
    ]


def test_gemm_cpu_raises(device):
    if device != "cpu":
        pytest.skip("the CPU backend's message")
    with pytest.raises(RuntimeError, match="runs on CUDA only"):
        torch.ops._C.gptq_marlin_gemm(*gemm_args(device))


def test_gemm_bad_inputs(device):
    require_cuda(device)
    op = torch.ops._C.gptq_marlin_gemm

    def call(index, value, match, **kwargs):
        args = gemm_args(device)
        args[index] = value
        with pytest.raises(RuntimeError, match=match):
            op(*args, **kwargs)

    args = gemm_args(device)
    call(10, 12345, "b_q_type 12345 is not supported")
    call(0, args[0].float(), "a must be float16 or bfloat16")
    call(13, 255, "a must have shape")
    call(4, args[4].to(torch.bfloat16), "b_scales must be")
    call(4, args[4][:, :64].contiguous(), "b_scales must have shape")
    call(1, torch.empty(5, 128, dtype=torch.float16, device=device), "c_or_none is not supported")
    call(5, torch.ones(1, device=device), "global_scale")
    call(6, torch.zeros(2, 16, dtype=torch.int32, device=device), "uint4b8 has its zero point")
    call(7, torch.arange(256, dtype=torch.int32, device=device), "needs both g_idx_or_none")
    call(9, torch.zeros(16, dtype=torch.int64, device=device), "workspace must be int32")
    call(2, args[2][:, :128].contiguous(), "b_q_weight")
    with pytest.raises(RuntimeError, match="is_zp_float"):
        op(*args, True, False, False, True)
    uint4 = gemm_args(device, weight_type="uint4")
    uint4[6] = None
    with pytest.raises(RuntimeError, match="needs zero points"):
        op(*uint4)


@pytest.mark.parametrize(
    "dtype,weight_type", [(torch.float16, "uint4b8"), (torch.bfloat16, "uint4")]
)
def test_gemm_opcheck(device, dtype, weight_type):
    require_cuda(device)
    args = gemm_args(device, dtype, weight_type)
    skip_if_left_out(args)
    torch.library.opcheck(torch.ops._C.gptq_marlin_gemm.default, args)


def test_gemm_compile(device):
    require_cuda(device)
    args = built_gemm_args(device)
    fn = torch.compile(lambda *xs: torch.ops._C.gptq_marlin_gemm(*xs), fullgraph=True)
    torch.testing.assert_close(fn(*args), torch.ops._C.gptq_marlin_gemm(*args), atol=0, rtol=0)


# --- codegen (no device needed) -------------------------------------------------------------


def test_codegen_grid_and_narrowing():
    proc = describe_generator()
    outputs = json.loads(proc.stdout)["outputs"]
    # 2 dtypes x 2 weight types x 2 group modes x 8 default block shapes (4 mma.sync, 3 wgmma
    # and the TMA-fed decode block for 9.0a), plus the dispatch.
    assert len(outputs) == 2 * 2 * 2 * 8 + 1 and "marlin_dispatch.cu" in outputs
    assert "marlin_bf16_uint4_channel_m32n256w.cu" in outputs
    assert "marlin_f16_uint4b8_grouped_m128n256w.cu" in outputs
    assert "marlin_f16_uint4_channel_m16n256t.cu" in outputs
    assert "marlin_bf16_uint4_grouped_m16n256.cu" in outputs
    assert not any("k2" in o for o in outputs), "the k-split shapes are built when named"
    # --describe lists every value an option accepts, the k2 shapes the default leaves out too.
    choices = json.loads(proc.stdout)["choices"]
    assert choices["dtypes"] == ["f16", "bf16"] and choices["groups"] == ["grouped", "channel"]
    built = {o.rsplit("_", 1)[1].removesuffix(".cu") for o in outputs if o != "marlin_dispatch.cu"}
    assert built < set(choices["shapes"]) and {"m32n256k2", "m64n256k2"} <= set(choices["shapes"])
    proc = describe_generator("dtypes=bf16", "groups=grouped")
    narrowed = json.loads(proc.stdout)["outputs"]
    assert len(narrowed) == 2 * 8 + 1
    assert all("_f16_" not in o and "_channel_" not in o for o in narrowed)
    proc = describe_generator("dtypes=bf16", "groups=grouped", "shapes=m64n256k2")
    assert json.loads(proc.stdout)["outputs"] == [
        "marlin_bf16_uint4_grouped_m64n256k2.cu",
        "marlin_bf16_uint4b8_grouped_m64n256k2.cu",
        "marlin_dispatch.cu",
    ]


def test_codegen_sm90a_shapes_need_sm90a():
    # The wgmma and TMA-fed blocks exist only where the family is built for 9.0a; naming them
    # otherwise is an error that says which arch to request.
    def outputs(archs, *options):
        return describe_generator(*options, archs=archs)

    for archs in ("8.0 9.0", "9.0", "8.0 8.9 10.0 12.0+PTX"):
        proc = outputs(archs)
        assert proc.returncode == 0, proc.stderr
        names = json.loads(proc.stdout)["outputs"]
        assert len(names) == 2 * 2 * 2 * 4 + 1
        assert not any(n.endswith(("w.cu", "t.cu")) for n in names)
    names = json.loads(outputs("8.0 9.0a").stdout)["outputs"]
    assert sum(n.endswith("w.cu") for n in names) == 2 * 2 * 2 * 3
    assert sum(n.endswith("t.cu") for n in names) == 2 * 2 * 2
    for shape in ("m128n256w", "m16n256t"):
        proc = outputs("9.0", f"shapes=m16n256,{shape}")
        assert proc.returncode != 0 and shape in proc.stderr and "9.0a" in proc.stderr


def test_codegen_rejects_bad_options():
    proc = describe_generator("groups=per_tensor")
    assert proc.returncode != 0 and "grouped,channel" in proc.stderr
    proc = describe_generator("backend=rocm")
    assert proc.returncode != 0 and "CUDA-only" in proc.stderr
