"""The paged_attention family's generator (grid, options, outputs) and a CPU emulation of its
CUDA kernels' index arithmetic (kernels/attention/paged_attention_kernels.cuh): which lane
loads which 16-byte piece of the [head_size / x, block_size, x] key layout and of the value
layout, which warp takes which cache block of a chunk, the chunk/partition split, the online
softmax across chunks and the v2 reduce. The emulation follows the kernel's formulas step by
step on flat caches and is checked against plain attention; it runs without a GPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "codegen" / "paged_attention.py"

# Constants of the kernel (paged_attention_kernels.cuh); change them together.
THREADS, WARP, CHUNK = 128, 32, 256
WARPS = THREADS // WARP


def run_gen(tmp_path, *options, describe=True):
    cmd = [sys.executable, str(GEN), "--out-dir", str(tmp_path / "o"), "--archs", "9.0a"]
    for o in options:
        cmd += ["--option", o]
    if describe:
        cmd.append("--describe")
    return subprocess.run(cmd, capture_output=True, text=True)


def test_full_grid_is_one_file_per_dtype_and_head_size(tmp_path):
    outputs = json.loads(run_gen(tmp_path).stdout)["outputs"]
    assert len(outputs) == 3 * 7 + 1 and "paged_attention_dispatch.cu" in outputs
    assert "paged_attention_bf16_h128.cu" in outputs


@pytest.mark.parametrize(
    "options, narrowed",
    [
        ((), False),
        (("xl=off", "kernel=staged"), False),
        (("block_sizes=16",), True),
        (("fp8=off",), True),
    ],
)
def test_missing_combination_names_narrowing_only_where_options_narrowed(
    tmp_path, options, narrowed
):
    # The tests skip a combination whose error says the grid was narrowed; at the default grid a
    # missing combination must not say so (it would be a bug, and the tests must fail on it).
    r = run_gen(tmp_path, *options, describe=False)
    assert r.returncode == 0, r.stderr
    dispatch = (tmp_path / "o" / "paged_attention_dispatch.cu").read_text()
    assert ("(narrowed by APHRODITE_GENERATOR_OPTIONS" in dispatch) == narrowed
    assert ("default grid should hold them" in dispatch) == (not narrowed)


def test_options_narrow_the_grid(tmp_path):
    r = run_gen(
        tmp_path,
        "head_sizes=128",
        "dtypes=bf16",
        "block_sizes=16",
        "fp8=off",
        "xl=off",
        describe=False,
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "o"
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".cu") == [
        "paged_attention_bf16_h128.cu",
        "paged_attention_dispatch.cu",
    ]
    inst = (out / "paged_attention_bf16_h128.cu").read_text()
    assert inst.count("template gpuError_t paged_attention_run<") == 1
    assert "uint8_t" not in inst
    assert "APHRODITE_PAGED_ATTENTION_XL" not in inst  # no XL instantiation of the mma kernel
    dispatch = (out / "paged_attention_dispatch.cu").read_text()
    assert "kXlBuilt = false" in dispatch and "head sizes 128; block sizes 16" in dispatch


def test_xl_option_builds_the_mma_kernels_xl_instantiation(tmp_path):
    xl = "#define APHRODITE_PAGED_ATTENTION_XL 1"
    for options, built in (((), True), (("xl=on",), True), (("xl=off",), False)):
        r = run_gen(tmp_path, "head_sizes=64", "dtypes=f16", *options, describe=False)
        assert r.returncode == 0, r.stderr
        inst = (tmp_path / "o" / "paged_attention_f16_h64.cu").read_text()
        dispatch = (tmp_path / "o" / "paged_attention_dispatch.cu").read_text()
        assert (xl in inst) == built, options
        if built:  # defined before the launchers are included
            assert inst.index(xl) < inst.index('#include "attention/paged_attention_launch.cuh"')
        assert f"kXlBuilt = {'true' if built else 'false'}" in dispatch, options


def test_wide_option_builds_the_mma_kernels_wide_instantiations(tmp_path):
    wide = "#define APHRODITE_PAGED_ATTENTION_WIDE 1"
    for options, built in (
        ((), True),
        (("wide=on",), True),
        (("wide=off",), False),
        (("kernel=staged",), False),  # no mma kernel, so nothing to widen
        (("backend=rocm",), False),
    ):
        r = run_gen(tmp_path, "head_sizes=64", "dtypes=f16", *options, describe=False)
        assert r.returncode == 0, r.stderr
        inst = (tmp_path / "o" / "paged_attention_f16_h64.cu").read_text()
        assert (wide in inst) == built, options
        if built:  # defined before the launchers are included
            assert inst.index(wide) < inst.index('#include "attention/paged_attention_launch.cuh"')
    r = run_gen(tmp_path, "wide=maybe", describe=False)
    assert r.returncode != 0 and "wide='maybe'" in r.stderr + r.stdout


def test_rocm_leaves_out_fp8_and_bad_options_fail(tmp_path):
    r = run_gen(tmp_path, "backend=rocm", "head_sizes=64", "dtypes=f16", describe=False)
    assert r.returncode == 0, r.stderr
    assert "uint8_t" not in (tmp_path / "o" / "paged_attention_f16_h64.cu").read_text()
    for bad in (
        "head_sizes=72",
        "fp8=maybe",
        "block_sizes=",
        "backend=metal",
        "min_blocks=0",
        "min_blocks=9",
        "min_blocks=x",
        "kernel=fast",
    ):
        r = run_gen(tmp_path, bad)
        assert r.returncode != 0 and ("expected" in r.stderr), (bad, r.stderr)


def test_min_blocks_sets_the_launch_bounds_minimum(tmp_path):
    define = "#define APHRODITE_PAGED_ATTENTION_MIN_BLOCKS"
    r = run_gen(tmp_path, "head_sizes=128", "dtypes=bf16", describe=False)
    assert r.returncode == 0, r.stderr
    inst = (tmp_path / "o" / "paged_attention_bf16_h128.cu").read_text()
    assert define not in inst  # the default: the header's 1, no register cap
    r = run_gen(tmp_path, "head_sizes=128", "dtypes=bf16", "min_blocks=3", describe=False)
    assert r.returncode == 0, r.stderr
    inst = (tmp_path / "o" / "paged_attention_bf16_h128.cu").read_text()
    assert f"{define} 3\n" in inst
    assert define + " 3\n" in (tmp_path / "o" / "paged_attention_dispatch.cu").read_text()
    assert inst.index(define) < inst.index('#include "attention/paged_attention_launch.cuh"')


def test_kernel_option_picks_the_attention_kernel(tmp_path):
    define = "#define APHRODITE_PAGED_ATTENTION_STAGED 1"

    def files(*options):
        r = run_gen(tmp_path, "head_sizes=128", "dtypes=bf16", *options, describe=False)
        assert r.returncode == 0, r.stderr
        out = tmp_path / "o"
        return [
            (out / f).read_text()
            for f in ("paged_attention_bf16_h128.cu", "paged_attention_dispatch.cu")
        ]

    mma = "#define APHRODITE_PAGED_ATTENTION_MMA 1"
    # mma by default: the tensor-core kernel, with staged for what it does not serve.
    assert all(define in f and mma in f for f in files())
    assert all(define in f and mma in f for f in files("kernel=mma"))
    assert all(define in f and mma not in f for f in files("kernel=staged"))
    assert not any(define in f or mma in f for f in files("kernel=regs"))
    assert not any(define in f or mma in f for f in files("kernel=mma", "backend=rocm"))
    assert not any(define in f for f in files("kernel=staged", "backend=rocm"))


# ---- the kernel's compile-time shape, as Shape<> computes it ---------------------------------
def cdiv(a, b):
    return -(-a // b)


def shape(cache_bytes, head, bs, kg):
    s = {"kX": 16 // cache_bytes}
    s["kNC"] = head // s["kX"]
    s["kLanesPerTok"] = WARP // bs
    s["kKIters"] = cdiv(s["kNC"], s["kLanesPerTok"])
    s["kBlocksPerChunk"] = CHUNK // bs
    s["kKBlk"] = min(2, max(1, s["kBlocksPerChunk"] // WARPS))
    s["kKBatch"] = min(s["kKIters"], max(1, 8 // s["kKBlk"]))
    s["kKBatches"] = cdiv(s["kKIters"], s["kKBatch"])
    s["kVE"] = min(s["kX"], bs)
    s["kSeg"] = bs // s["kVE"]
    s["kNPV"] = head * s["kSeg"]
    w = 1
    while not (w >= WARPS or cdiv(s["kNPV"], WARP * w) * kg <= 16):
        w *= 2
    s["kVTeam"] = min(w, WARPS)
    s["kTeams"] = WARPS // s["kVTeam"]
    s["kVIters"] = cdiv(s["kNPV"], WARP * s["kVTeam"])
    s["kVBlk"] = min(max(1, 8 // s["kVIters"]), max(1, s["kBlocksPerChunk"] // s["kTeams"]))
    return s


SHAPES = [
    (cb, h, bs, kg)
    for cb in (1, 2, 4)
    for h in (64, 80, 96, 112, 128, 192, 256)
    for bs in (8, 16, 32)
    for kg in (1, 4, 8)
]


@pytest.mark.parametrize("cb,head,bs,kg", SHAPES)
def test_every_piece_and_block_is_read_exactly_once(cb, head, bs, kg):
    s = shape(cb, head, bs, kg)
    # QK: lane reads piece (c, slot) at element offset (c * bs + slot) * x of the block.
    seen = []
    for lane in range(WARP):
        slot, cl = lane % bs, lane // bs
        for batch in range(s["kKBatches"]):
            for i in range(s["kKBatch"]):
                c = cl + s["kLanesPerTok"] * (batch * s["kKBatch"] + i)
                if c < s["kNC"]:
                    seen.append((c * bs + slot) * s["kX"])
    assert sorted(seen) == list(range(0, head * bs, s["kX"]))
    # One warp instruction (fixed batch, i) reads 32 consecutive pieces: 512 contiguous bytes.
    for batch in range(s["kKBatches"]):
        for i in range(s["kKBatch"]):
            offs = [
                ((lane // bs) + s["kLanesPerTok"] * (batch * s["kKBatch"] + i)) * bs + lane % bs
                for lane in range(WARP)
            ]
            offs = [o for o in offs if o < s["kNC"] * bs]
            assert offs == list(range(offs[0], offs[0] + len(offs))) if offs else True
    # PV: team thread tt reads piece pi = (d, seg) at d * bs + seg * kVE; seg = tt % kSeg.
    seen = []
    team_threads = s["kVTeam"] * WARP
    for tt in range(team_threads):
        for i in range(s["kVIters"]):
            pi = tt + team_threads * i
            if pi < s["kNPV"]:
                assert pi % s["kSeg"] == tt % s["kSeg"]
                seen.append((pi // s["kSeg"]) * bs + (tt % s["kSeg"]) * s["kVE"])
    assert sorted(seen) == list(range(0, head * bs, s["kVE"]))
    assert WARP % s["kSeg"] == 0 and s["kVE"] % 4 == 0 and s["kX"] % 4 == 0
    # Vectors: 16 bytes (8 for fp8 values of 8-token blocks), aligned within the block.
    assert s["kVE"] * cb in (8, 16) and (bs * cb) % (s["kVE"] * cb) == 0
    # Blocks of a chunk: QK warps and PV teams cover each block index once.
    for nb in range(1, s["kBlocksPerChunk"] + 1):
        qk = [
            b0 + u * WARPS
            for w in range(WARPS)
            for b0 in range(w, nb, WARPS * s["kKBlk"])
            for u in range(s["kKBlk"])
            if b0 + u * WARPS < nb
        ]
        assert sorted(qk) == list(range(nb))
        pv = [
            b0 + u * s["kTeams"]
            for t in range(s["kTeams"])
            for b0 in range(t, nb, s["kTeams"] * s["kVBlk"])
            for u in range(s["kVBlk"])
            if b0 + u * s["kTeams"] < nb
        ]
        assert sorted(pv) == list(range(nb))
    # Loads in flight per lane stay within 64 registers (16-byte keys; values kVE elements).
    assert s["kKBlk"] * s["kKBatch"] <= 8
    assert s["kVBlk"] * s["kVIters"] * s["kVE"] * cb <= 64 * 4


# ---- the staged kernel (paged_attention.kernel=staged), as StagedShape<> computes it -------
MAX_STAGES, TILE_BYTES, MAX_RING = 4, 16384, 65536


def pow2_floor(v):
    return 2 * pow2_floor(v // 2) if v >= 2 else 1


def staged_shape(cache_bytes, head, bs):
    s = {"kX": 16 // cache_bytes}
    s["kNC"] = head // s["kX"]
    s["kTT"] = min(128, max(bs, pow2_floor(TILE_BYTES // (head * cache_bytes))))
    s["kTB"] = s["kTT"] // bs
    s["kBlkElems"] = head * bs
    s["kBlk16"] = head * bs * cache_bytes // 16
    tile = s["kTT"] * head * cache_bytes
    s["kStages"] = min(MAX_STAGES, max(2, MAX_RING // tile))
    s["kRingBytes"] = s["kStages"] * tile
    s["kLPT"] = THREADS // s["kTT"]
    s["kTPW"] = WARP // s["kLPT"]
    s["kKIters"] = cdiv(s["kNC"], s["kLPT"])
    s["kTG"] = max(1, THREADS // head)
    s["kDThreads"] = THREADS // s["kTG"]
    s["kDIters"] = cdiv(head, s["kDThreads"])
    s["kVE"] = min(s["kX"], bs)
    s["kSegs"] = s["kTT"] // s["kVE"]
    return s


def staged_tiles(begin, end, bs, tb):
    """The producer's tile order for tokens [begin, end): (chunk start, kind, first block,
    blocks), advanced as the kernel's issue() does."""
    tiles, pc0, kind, tile = [], begin, 0, 0
    while pc0 < end:
        nb = cdiv(min(CHUNK, end - pc0), bs)
        b0 = tile * tb
        tiles.append((pc0, kind, b0, min(tb, nb - b0)))
        tile += 1
        if tile * tb >= nb:
            tile = 0
            if kind == 0:
                kind = 1
            else:
                kind, pc0 = 0, pc0 + CHUNK
    return tiles


@pytest.mark.parametrize("cb,head,bs", sorted({(cb, h, bs) for cb, h, bs, _ in SHAPES}))
def test_staged_tiles_cover_every_token_piece_and_dimension_once(cb, head, bs):
    s = staged_shape(cb, head, bs)
    assert CHUNK % s["kTT"] == 0 and s["kTT"] % bs == 0 and 1 <= s["kLPT"] <= WARP
    assert bs % s["kVE"] == 0 and s["kVE"] % 4 == 0 and s["kX"] % 4 == 0
    # Shared memory: the ring plus the largest static buffers (kG = 8) fit the 99 KiB that
    # every sm_80+ GPU allows a block; at least two tiles, so that copies overlap compute.
    static = 8 * (2 * head + CHUNK) * 4 + 3 * 8 * 4
    assert s["kRingBytes"] <= MAX_RING and s["kRingBytes"] + static <= 99 * 1024
    assert s["kStages"] >= 2
    # Copies: 16-byte pieces of whole cache blocks, tiles 16-byte aligned in the ring.
    assert (s["kBlkElems"] * cb) % 16 == 0 and (s["kTT"] * head * cb) % 16 == 0
    # QK: thread (warp, lane) takes token warp * kTPW + lane % kTPW and pieces
    # c = lane // kTPW + kLPT * i; the lanes of a token differ in the bits the xor-shuffles
    # (offsets kTPW, 2 kTPW, ... < 32) reach, so the sum of a token is complete.
    seen = []
    lanes_of = {}
    for tid in range(THREADS):
        warp, lane = divmod(tid, WARP)
        tok = warp * s["kTPW"] + lane % s["kTPW"]
        j = lane // s["kTPW"]
        lanes_of.setdefault(tok, []).append((warp, lane))
        blk, slot = divmod(tok, bs)
        for i in range(s["kKIters"]):
            c = j + s["kLPT"] * i
            if c < s["kNC"]:
                seen.append(blk * s["kBlkElems"] + (c * bs + slot) * s["kX"])
    assert sorted(seen) == list(range(0, s["kTT"] * head, s["kX"]))
    offsets = []
    o = s["kTPW"]
    while o < WARP:
        offsets.append(o)
        o <<= 1
    for tok, lanes in lanes_of.items():
        assert len({w for w, _ in lanes}) == 1, tok  # one warp
        reach = {lanes[0][1]}
        for o in offsets:
            reach |= {r ^ o for r in reach}
        assert reach == {ln for _, ln in lanes}, tok
    # PV: thread (tg, dl) takes dimensions dl + kDThreads * i and segments sg % kTG == tg:
    # (token, dimension) pairs of a tile once each, at element d * bs + slot of the block.
    seen = []
    for tid in range(THREADS):
        tg, dl = divmod(tid, s["kDThreads"])
        for sg in range(tg, s["kSegs"], s["kTG"]):
            tt0 = sg * s["kVE"]
            blk, slot0 = divmod(tt0, bs)
            for i in range(s["kDIters"]):
                d = dl + s["kDThreads"] * i
                if d < head:
                    for e in range(s["kVE"]):
                        seen.append(blk * s["kBlkElems"] + d * bs + slot0 + e)
    assert sorted(seen) == list(range(s["kTT"] * head))
    # The tile sequence: per chunk its K tiles then its V tiles, whole blocks [0, nb) once
    # each, never a block past the range's last token; the consumer walks the same order.
    for begin, end in [(0, 1), (0, bs), (0, 257), (512, 1000), (0, 3 * CHUNK + 5), (256, 512)]:
        tiles = staged_tiles(begin, end, bs, s["kTB"])
        expect = []
        for c0 in range(begin, end, CHUNK):
            nb = cdiv(min(CHUNK, end - c0), bs)
            ntile = cdiv(nb, s["kTB"])
            for kind in (0, 1):
                for t in range(ntile):
                    expect.append((c0, kind, t * s["kTB"], min(s["kTB"], nb - t * s["kTB"])))
                blocks = [
                    b0 + k for c, kd, b0, n in expect if c == c0 and kd == kind for k in range(n)
                ]
                assert blocks == list(range(nb))
                assert (c0 // bs + nb - 1) * bs < end
        assert tiles == expect


# ---- an emulation of the kernels on flat caches ----------------------------------------------
def emulate(
    q,
    kflat,
    vflat,
    tables,
    seq_lens,
    alibi,
    u,
    bd,
    *,
    num_kv_heads,
    head,
    bs,
    x,
    scale,
    partition,
    kg,
    kv_block_stride,
    kv_head_stride,
):
    """What the v1 (partition=None) or v2 kernels compute, by their index formulas."""
    nseq, heads, _ = q.shape
    group = heads // num_kv_heads
    kg_eff = 1 if group <= 1 else (4 if group <= 4 else 8)
    assert kg == kg_eff
    splits = cdiv(group, kg)
    s_ = shape(16 // x, head, bs, kg)
    out = np.full((nseq, heads, head), np.nan)
    psize = partition or (1 << 40)
    nparts = cdiv(int(max(seq_lens.max(), 1)), psize) if partition else 1
    parts = {}
    for s in range(nseq):
        L = int(seq_lens[s])
        for kvh in range(num_kv_heads):
            for split in range(splits):
                head0 = kvh * group + split * kg
                ng = min(kg, group - split * kg)
                for p in range(nparts):
                    begin = p * psize
                    if begin >= L and not (L == 0 and p == 0 and not partition):
                        continue
                    end = min(L, begin + psize)
                    direct = not partition or L <= psize
                    if L == 0:
                        out[s, head0 : head0 + ng] = 0
                        continue
                    hs = range(head0, head0 + ng)
                    qs = np.stack(
                        [(q[s, h] + (u[s, h] if u is not None else 0)) * scale for h in hs]
                    )
                    run_max = np.full(ng, -np.inf)
                    run_sum = np.zeros(ng)
                    acc = np.zeros((ng, head))
                    for c0 in range(begin, end, CHUNK):
                        n = min(CHUNK, end - c0)
                        nb = cdiv(n, bs)
                        first = c0 // bs
                        assert c0 % bs == 0 and first + nb <= cdiv(L, bs)
                        score = np.zeros((ng, nb * bs))
                        for b in range(nb):
                            phys = int(tables[s, first + b])
                            base = phys * kv_block_stride + kvh * kv_head_stride
                            for slot in range(bs):
                                t = b * bs + slot
                                if t >= n:
                                    continue
                                kvec = np.concatenate(
                                    [
                                        kflat[base + slot * x + c * bs * x :][:x]
                                        for c in range(s_["kNC"])
                                    ]
                                )
                                j = c0 + t
                                for gi, h in enumerate(hs):
                                    sc = qs[gi] @ kvec
                                    if alibi is not None:
                                        sc += alibi[h] * (j - L + 1)
                                    if bd is not None:
                                        sc += bd[s, h, j]
                                    score[gi, t] = sc
                        for gi in range(ng):
                            m = max(run_max[gi], score[gi, :n].max())
                            pr = np.zeros(nb * bs)
                            pr[:n] = np.exp(score[gi, :n] - m)
                            alpha = 0.0 if run_max[gi] == -np.inf else np.exp(run_max[gi] - m)
                            run_sum[gi] = run_sum[gi] * alpha + pr.sum()
                            run_max[gi] = m
                            acc[gi] *= alpha
                            for b in range(nb):
                                phys = int(tables[s, first + b])
                                vb = phys * kv_block_stride + kvh * kv_head_stride
                                for d in range(head):
                                    for seg in range(s_["kSeg"]):
                                        t0 = b * bs + seg * s_["kVE"]
                                        v = vflat[vb + d * bs + seg * s_["kVE"] :][: s_["kVE"]]
                                        v = np.where(np.arange(t0, t0 + s_["kVE"]) < n, v, 0)
                                        acc[gi, d] += pr[t0 : t0 + s_["kVE"]] @ v
                    res = acc / run_sum[:, None]
                    if direct:
                        out[s, head0 : head0 + ng] = res
                    else:
                        for gi, h in enumerate(hs):
                            parts[(s, h, p)] = (run_max[gi], run_sum[gi], res[gi])
    if partition:  # the reduce
        for s in range(nseq):
            L = int(seq_lens[s])
            for h in range(heads):
                if L == 0:
                    out[s, h] = 0
                    continue
                if L <= psize:
                    continue
                npart = cdiv(L, psize)
                m = max(parts[(s, h, i)][0] for i in range(npart))
                w = [parts[(s, h, i)][1] * math.exp(parts[(s, h, i)][0] - m) for i in range(npart)]
                out[s, h] = sum(wi * parts[(s, h, i)][2] for i, wi in enumerate(w)) / sum(w)
    return out


def reference(q, k, v, seq_lens, alibi, u, bd, num_kv_heads, scale):
    nseq, heads, head = q.shape
    group = heads // num_kv_heads
    out = np.zeros_like(q)
    for s in range(nseq):
        L = int(seq_lens[s])
        if L == 0:
            continue
        for h in range(heads):
            kk, vv = k[s, h // group, :L], v[s, h // group, :L]
            sc = ((q[s, h] + (u[s, h] if u is not None else 0)) @ kk.T) * scale
            if alibi is not None:
                sc = sc + alibi[h] * (np.arange(L) - L + 1)
            if bd is not None:
                sc = sc + bd[s, h, :L]
            pr = np.exp(sc - sc.max())
            out[s, h] = pr @ vv / pr.sum()
    return out


@pytest.mark.parametrize(
    "head,bs,x,heads,kv_heads,partition,features",
    [
        (80, 16, 8, 8, 2, 512, "alibi"),
        (64, 8, 4, 6, 1, 256, "xl"),  # group 6: kG 8 with 2 idle heads; fp32 layout
        (96, 32, 16, 16, 1, 96, "xl+alibi"),  # group 16: two blocks per kv head; fp8 layout
        (112, 16, 8, 2, 2, None, ""),  # MHA, v1
        (64, 32, 8, 4, 2, None, "alibi"),
    ],
)
def test_emulated_kernel_matches_attention(head, bs, x, heads, kv_heads, partition, features):
    rng = np.random.default_rng(head * bs + heads)
    seq_lens = np.array([1, 17, 600, 0, 300])
    nseq, max_len = len(seq_lens), int(seq_lens.max())
    nblk = cdiv(max_len, bs)
    num_blocks = nseq * nblk + 5
    q = rng.standard_normal((nseq, heads, head))
    k = rng.standard_normal((nseq, kv_heads, nblk * bs, head))
    v = rng.standard_normal((nseq, kv_heads, nblk * bs, head))
    perm = rng.permutation(num_blocks)[: nseq * nblk]
    tables = np.full((nseq, nblk + 3), -1)  # entries past a sequence's blocks are never read
    # Caches with padded strides: kv_head_stride > head * bs, kv_block_stride > heads * that.
    head_stride = head * bs + 16 // (16 // x) * x
    block_stride = kv_heads * head_stride + 2 * x
    kflat = np.full(num_blocks * block_stride, np.nan)
    vflat = np.full(num_blocks * block_stride, np.nan)
    for s in range(nseq):
        for b in range(nblk):
            phys = perm[s * nblk + b]
            tables[s, b] = phys
            for kvh in range(kv_heads):
                base = phys * block_stride + kvh * head_stride
                for slot in range(bs):
                    j = b * bs + slot
                    if j >= seq_lens[s]:
                        continue  # unused slots stay NaN, as a real cache may
                    for c in range(head // x):
                        kflat[base + (c * bs + slot) * x :][:x] = k[s, kvh, j, c * x : (c + 1) * x]
                    vflat[base + np.arange(head) * bs + slot] = v[s, kvh, j]
    alibi = rng.random(heads) if "alibi" in features else None
    u = rng.standard_normal((nseq, heads, head)) if "xl" in features else None
    bd = rng.standard_normal((nseq, heads, max_len)) if "xl" in features else None
    group = heads // kv_heads
    kg = 1 if group <= 1 else (4 if group <= 4 else 8)
    scale = head**-0.5
    got = emulate(
        q,
        kflat,
        vflat,
        tables,
        seq_lens,
        alibi,
        u,
        bd,
        num_kv_heads=kv_heads,
        head=head,
        bs=bs,
        x=x,
        scale=scale,
        partition=partition,
        kg=kg,
        kv_block_stride=block_stride,
        kv_head_stride=head_stride,
    )
    want = reference(q, k, v, seq_lens, alibi, u, bd, kv_heads, scale)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
