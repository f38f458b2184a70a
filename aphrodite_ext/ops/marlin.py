"""Marlin-style W4A16 GEMM (kernels/marlin): typed wrappers of the GEMM and of the repacks from
GPTQ / AWQ checkpoints into our tile layout, the plain-torch inverse of that layout, test-weight
quantizers and the fp32 reference ``a @ dequant(w)``.

The packed layout (kernels/marlin/marlin.h): int32 [K / 16, 2 * N]; tile (kt, nt) of 16 x 64
codes is 128 words at [kt, 128 * nt : 128 * (nt + 1)], word 4 * lane + w, nibble p holding
    n = 64 * nt + 8 * (2 * w + (p & 1)) + lane // 4
    k = 16 * kt + 2 * (lane % 4) + ((p >> 2) & 1) + 8 * ((p >> 1) & 1)
so that each lane's 16 bytes are its mma.sync B fragments for 8 n8 sub-tiles.

Differences from vLLM's Marlin for engines that call these ops: the schemas match, but the packed
weight is our layout (repack with the ops here, not vLLM's), b_scales are plain row-major
[K / group, N] (no marlin_permute_scales), and AWQ zero points are plain-order 4-bit codes
[K / group, N / 8] (awq_zeros_to_marlin converts AWQ's qzeros). The workspace holds split-K tile
counters (zeros, left zeroed); vLLM's one-counter-per-SM workspace works and splits less.

For tuning only: the environment variable
APHRODITE_MARLIN_CONFIG="m<rows>n<cols>[k<k warps>][w|t][:<splits>[/<sum>]|:sk[<blocks>]]" (e.g.
"m16n256:4", "m64n256k2", "m64n256:sk", "m16n256t:8/spread"), read on every call, forces the
GEMM's thread-block shape and its split-K factor, or stream-K over <blocks> blocks per row of
blocks (default: as many as are resident at once), instead of the dispatch's choice
(benchmarks/bench_marlin.py --sweep times them all). <sum> names how a split tile's blocks sum
it: "cluster" (sm_90: through the shared memory of the tile's blocks, run as one cluster),
"spread" (every block of a grid held at once sums a share through global memory) or "last" (the
last block to arrive sums it all); the call raises where the launch cannot take that way. Every
configuration computes the same result up to fp32 summation order, and the three sums of one
split the same bits.

The workspace's counters must be zero when a GEMM starts, and every GEMM leaves them so: a
workspace is not to be shared by GEMMs that may run at the same time (on two streams). Each GEMM
tags its counts (the launch's tag rides above the count), so a split tile summed through global
memory whose counter holds anything but its own GEMM's arrivals fails the GEMM with an
illegal-address fault (the CUDA context is then unusable) rather than summing the tile wrongly or
waiting for ever. Where the last block sums the tile, a leftover that reads as this GEMM's own
counts (a captured graph's replay stopped midway, or a few tag collisions) can still give a wrong
tile (marlin_gemm.cuh says which).
"""

from __future__ import annotations

import torch

from .. import load

# vLLM's ScalarType ids (vllm/scalar_type.py: exponent 8 bits, mantissa 8, signed 1, bias 32,
# finite-only 1, nan_repr 8): the b_q_type values gptq_marlin_gemm takes.
UINT4B8_ID = (4 << 8) | (8 << 17) | (1 << 50)  # GPTQ: w = (code - 8) * scale
UINT4_ID = (4 << 8) | (1 << 50)  # AWQ: w = (code - zero) * scale
WEIGHT_TYPE_IDS = {"uint4b8": UINT4B8_ID, "uint4": UINT4_ID}

TILE_K, TILE_N = 16, 64
# AWQ packs columns 0..7 of a word into nibbles in the order 0 2 4 6 1 3 5 7, so column c sits
# at nibble AWQ_NIBBLE_OF_COLUMN[c].
AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)
# Split-K tile counters; more than any split plan uses (it splits only when the tiles number
# fewer than twice the SMs).
WORKSPACE_COUNTERS = 4096


def make_workspace(device: torch.device | str) -> torch.Tensor:
    """The zeroed int32 workspace gptq_marlin_gemm takes (it leaves it zeroed again). One a
    stream: calls that may run at the same time must not share one (a split tile's blocks may
    wait on its counters)."""
    return torch.zeros(WORKSPACE_COUNTERS, dtype=torch.int32, device=device)


def gptq_marlin_repack(
    b_q_weight: torch.Tensor, perm: torch.Tensor | None, size_k: int, size_n: int
) -> torch.Tensor:
    """GPTQ qweight int32 [K / 8, N] (row-major nibbles along K) -> our layout [K / 16, 2N].
    With `perm` (act-order), packed row k is checkpoint row perm[k]."""
    load("_C")
    if perm is None:
        perm = torch.empty(0, dtype=torch.int32, device=b_q_weight.device)
    return torch.ops._C.gptq_marlin_repack(b_q_weight, perm, size_k, size_n, 4)


def awq_marlin_repack(b_q_weight: torch.Tensor, size_k: int, size_n: int) -> torch.Tensor:
    """AWQ qweight int32 [K, N / 8] (AWQ's interleaved nibbles) -> our layout [K / 16, 2N]."""
    load("_C")
    return torch.ops._C.awq_marlin_repack(b_q_weight, size_k, size_n, 4)


def gptq_marlin_gemm(
    a: torch.Tensor,
    b_q_weight: torch.Tensor,
    b_scales: torch.Tensor,
    workspace: torch.Tensor,
    weight_type: str = "uint4b8",
    b_zeros: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    perm: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """a [M, K] fp16/bf16 @ dequant(b_q_weight) -> [M, N] in a's dtype, fp32 accumulation.
    b_scales [K / group, N] (one row: per channel); b_zeros [K / group, N / 8] in our plain
    nibble order (awq_zeros_to_marlin) for weight_type "uint4"; g_idx and perm for act-order."""
    load("_C")
    size_n = b_scales.shape[1]
    return torch.ops._C.gptq_marlin_gemm(
        a,
        None,
        b_q_weight,
        bias,
        b_scales,
        None,
        b_zeros,
        g_idx,
        perm,
        workspace,
        WEIGHT_TYPE_IDS[weight_type],
        a.shape[0],
        size_n,
        a.shape[1],
    )


# --- plain-torch layout helpers, test-weight quantizers and the reference ----------------------


def _tile_index_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dn) within a 16 x 64 tile of each (lane, word, nibble), flattened in that order."""
    lane = torch.arange(32, device=device).view(32, 1, 1)
    w = torch.arange(4, device=device).view(1, 4, 1)
    p = torch.arange(8, device=device).view(1, 1, 8)
    dn = 8 * (2 * w + (p & 1)) + lane // 4
    dk = 2 * (lane % 4) + ((p >> 2) & 1) + 8 * ((p >> 1) & 1)
    return dk.expand(32, 4, 8).reshape(-1), dn.expand(32, 4, 8).reshape(-1)


def unpack_marlin(packed: torch.Tensor, size_k: int, size_n: int) -> torch.Tensor:
    """Inverse of the repacks: our layout [K / 16, 2N] -> codes int32 [K, N] in 0..15."""
    kt, nt = size_k // TILE_K, size_n // TILE_N
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    nibbles = (packed.view(kt, nt, 128, 1) >> shifts) & 0xF  # [kt, nt, lane*4+w, p]
    dk, dn = _tile_index_map(packed.device)
    tiles = torch.empty(kt, nt, TILE_K * TILE_N, dtype=torch.int32, device=packed.device)
    tiles[:, :, dk * TILE_N + dn] = nibbles.reshape(kt, nt, -1)
    return tiles.view(kt, nt, TILE_K, TILE_N).permute(0, 2, 1, 3).reshape(size_k, size_n)


def pack_gptq(codes: torch.Tensor) -> torch.Tensor:
    """codes [K, N] in 0..15 -> GPTQ qweight int32 [K / 8, N]: nibble i of row r is row 8r + i."""
    k, n = codes.shape
    c = codes.to(torch.int64).view(k // 8, 8, n)
    shifts = (4 * torch.arange(8, device=codes.device)).view(1, 8, 1)
    return _to_int32((c << shifts).sum(1))


def pack_awq(codes: torch.Tensor) -> torch.Tensor:
    """codes [K, N] in 0..15 -> AWQ qweight int32 [K, N / 8] with AWQ's nibble order (also the
    layout of AWQ's qzeros [K / group, N / 8])."""
    k, n = codes.shape
    c = codes.to(torch.int64).view(k, n // 8, 8)
    shifts = (4 * torch.tensor(AWQ_NIBBLE_OF_COLUMN, device=codes.device)).view(1, 1, 8)
    return _to_int32((c << shifts).sum(-1))


def pack_plain(codes: torch.Tensor) -> torch.Tensor:
    """codes [R, N] -> int32 [R, N / 8], nibble c of word j = column 8j + c: the zero-point
    layout gptq_marlin_gemm takes."""
    r, n = codes.shape
    c = codes.to(torch.int64).view(r, n // 8, 8)
    shifts = (4 * torch.arange(8, device=codes.device)).view(1, 1, 8)
    return _to_int32((c << shifts).sum(-1))


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ-ordered int32 [R, N / 8] -> codes int32 [R, N]."""
    shifts = 4 * torch.tensor(AWQ_NIBBLE_OF_COLUMN, device=packed.device, dtype=torch.int32)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1)


def awq_zeros_to_marlin(qzeros: torch.Tensor) -> torch.Tensor:
    """AWQ qzeros int32 [K / group, N / 8] (AWQ nibble order) -> our plain nibble order."""
    return pack_plain(unpack_awq(qzeros))


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) -> int32 with the same bits."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def quantize_weights(
    w: torch.Tensor,
    weight_type: str,
    group_size: int,
    act_order: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Quantizes w [K, N] as a GPTQ ("uint4b8", symmetric) or AWQ ("uint4", zero points)
    checkpoint would, with groups of `group_size` rows (-1: one group per channel). With
    act_order, rows are assigned to groups in a random order (GPTQ desc_act): g_idx[k] is row
    k's group and perm = argsort(g_idx) the repack's row order.

    Returns codes [K, N] int32, scales [G, N] (scale_dtype), zeros [G, N] int32 codes
    (8 for uint4b8), g_idx [K] int32, perm [K] int32 (empty without act_order), and the
    dequantized weight w_ref [K, N] fp32 (scales rounded to scale_dtype, as the kernel sees)."""
    k, n = w.shape
    gs = k if group_size == -1 else group_size
    assert k % gs == 0, (k, gs)
    groups = k // gs
    if act_order:
        order = torch.randperm(k, generator=generator, device="cpu").to(w.device)
        g_idx = torch.empty(k, dtype=torch.int64, device=w.device)
        g_idx[order] = torch.arange(k, device=w.device) // gs
        perm = torch.argsort(g_idx, stable=True)
    else:
        g_idx = torch.arange(k, device=w.device) // gs
        perm = torch.empty(0, dtype=torch.int64, device=w.device)
    wf = w.float()
    # Each group has exactly gs rows, contiguous once rows are sorted by group: [G, gs, N].
    rows = torch.argsort(g_idx, stable=True)
    grouped = wf[rows].view(groups, gs, n)
    gmax, gmin = grouped.amax(1), grouped.amin(1)
    if weight_type == "uint4b8":
        scales = (torch.maximum(gmax.abs(), gmin.abs()) / 7.0).clamp_min(1e-6)
        scales = scales.to(scale_dtype).float()
        zeros = torch.full_like(scales, 8.0)
    elif weight_type == "uint4":
        scales = ((gmax - gmin) / 15.0).clamp_min(1e-6).to(scale_dtype).float()
        zeros = torch.clamp(torch.round(-gmin / scales), 0, 15)
    else:
        raise ValueError(f"weight_type must be uint4b8 or uint4, got {weight_type!r}")
    s_rows, z_rows = scales[g_idx], zeros[g_idx]
    codes = torch.clamp(torch.round(wf / s_rows) + z_rows, 0, 15)
    w_ref = (codes - z_rows) * s_rows
    return {
        "codes": codes.to(torch.int32),
        "scales": scales.to(scale_dtype),
        "zeros": zeros.to(torch.int32),
        "g_idx": g_idx.to(torch.int32),
        "perm": perm.to(torch.int32),
        "w_ref": w_ref,
    }


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """fp32 [K, N]: (codes - zeros[g_idx]) * scales[g_idx]."""
    g = g_idx.long()
    return (codes.float() - zeros.float()[g]) * scales.float()[g]


def gemm_ref(a: torch.Tensor, w_dequant: torch.Tensor, bias: torch.Tensor | None = None):
    """The fp32 reference: a @ dequant(w) (+ bias), in fp32."""
    out = a.float() @ w_dequant.float()
    return out if bias is None else out + bias.float()
