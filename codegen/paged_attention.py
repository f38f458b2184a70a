"""Generates the paged_attention family's GPU instantiations: one translation unit per
(query dtype, head size), each instantiating every block size and cache dtype of the build,
and the dispatch that implements launch_paged_attention_v1/v2 (kernels/attention/
paged_attention.h) and names what a build left out.

Options (APHRODITE_GENERATOR_OPTIONS="paged_attention.head_sizes=128;paged_attention.fp8=off"):
  head_sizes   which head sizes to instantiate (default: all of HEAD_SIZES)
  dtypes       which query dtypes (default: all of DTYPES)
  block_sizes  which cache block sizes (default: all of BLOCK_SIZES)
  fp8          on/off: the fp8 E4M3 cache (default on; always off on rocm)
  xl           on/off: the Transformer-XL ops (default on; the staged and regs kernels run them
               on a run-time path, the mma kernel as an instantiation of its own: one more
               kernel per block size in each file, bf16 head 128 for sm_90a 16.6 -> 19.9 s)
  wide         on/off: the mma kernel's wide (8-warp) instantiations beside its 4-warp ones (default
               on; one more kernel per block size and XL mode in each 16-bit file but head 256's
               at block size 32: bf16 head 128 without the fp8 cache, sm_90a, 15.1 -> 21.2 s of
               nvcc), which the launcher runs where the grid has at most a block an SM, each
               warp gets a step and the shared memory fits (paged_attention_launch.cuh's
               mma_wide). split_kv asks the launcher which blocks fit: with wide=off it
               splits for 4-warp blocks, some problems slower (6 x 1024 on an H200: 512-token
               partitions, 18.6 us, where v1 took 17.8 in wide blocks and 23.1 in 4-warp ones)
  min_blocks   1..8: resident 128-thread blocks per SM the regs kernel is compiled for
               (__launch_bounds__; default 1 = no register cap, 3 caps at 168 registers, 4 at
               128); a tuning knob, so that builds can be measured against each other
  kernel       mma (default), staged or regs: the attention kernel that the launchers run.
               mma runs fp16/bf16 queries over caches of the same dtype on sm_80+ with
               tensor cores (paged_attention_mma_kernel, kernels/attention/
               paged_attention_mma.cuh) where its shared memory fits the device, and
               everything else (fp32, fp8 caches) as staged;
               staged copies K and V into a shared-memory ring with cp.async
               (paged_attention_staged_kernel; CUDA only: rocm builds run regs); regs loads
               them into registers (paged_attention_kernel, the first kernel). On an H100
               staged was as fast for v1 and 1.2-1.3x faster for v2 at long contexts, with
               tests and compute-sanitizer racecheck clean (benchmarks/results)
  backend      cuda or rocm (set by the build)

Cost: the full grid is 21 files; with kernel=regs each held 18 kernels (3 block sizes x 2
caches x 3 group tilings), and a clean -j2 build for 9.0a on the 2-core machine took 873 s of
CPU for the whole project, most of it here. With kernel=mma (the default) a 16-bit file holds
30: per block size the staged kernel's 6, the mma kernel and its XL instantiation, each in 4-warp
and wide blocks (24 with wide=off; 28 at head 256). The staged
kernel compiles about 4x faster than regs (bf16, head size 256: 12 s of nvcc CPU time against
52 s, 9.0a, on that machine). CI can narrow the grid:
"paged_attention.dtypes=bf16,f16;paged_attention.head_sizes=64,128,256" builds 6 of the 21
files.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


@dataclass(frozen=True)
class DType:
    name: str  # file-name and option spelling
    cpp: str  # device element type
    enum: str  # ScalarType enumerator
    pretty: str  # in error messages


@dataclass(frozen=True)
class Cache:
    name: str
    cpp: str | None  # cache element type; None: the query's
    enum: str  # KvCacheDtype enumerator


DTYPES = [
    DType("f32", "float", "kFloat32", "float32"),
    DType("f16", "__half", "kFloat16", "float16"),
    DType("bf16", "__nv_bfloat16", "kBFloat16", "bfloat16"),
]
HEAD_SIZES = ["64", "80", "96", "112", "128", "192", "256"]
BLOCK_SIZES = ["8", "16", "32"]
CACHES = [Cache("auto", None, "kAuto"), Cache("fp8", "uint8_t", "kFp8E4M3")]
# The keys of the Options above (common.main rejects any other).
OPTION_KEYS = (
    "head_sizes",
    "dtypes",
    "block_sizes",
    "fp8",
    "xl",
    "wide",
    "min_blocks",
    "kernel",
)
TEMPLATES = ["paged_attention_instance.cu.j2", "paged_attention_dispatch.cu.j2"]


@dataclass(frozen=True)
class Grid:
    dtypes: list[DType]
    head_sizes: list[int]
    block_sizes: list[int]
    caches: list[Cache]
    xl: bool
    wide: bool
    min_blocks: int
    staged: bool
    mma: bool


def switch(request: common.Request, key: str, default: bool) -> bool:
    value = request.options.get(key)
    if value is None:
        return default
    if value not in ("on", "off"):
        raise SystemExit(f"generator option {key}={value!r}: expected on or off")
    return value == "on"


def min_blocks(request: common.Request) -> int:
    value = request.options.get("min_blocks", "1")
    if not value.isdigit() or not 1 <= int(value) <= 8:
        raise SystemExit(f"generator option min_blocks={value!r}: expected 1 to 8")
    return int(value)


def kernel(request: common.Request) -> str:
    value = request.options.get("kernel", "mma")
    if value not in ("regs", "staged", "mma"):
        raise SystemExit(f"generator option kernel={value!r}: expected mma, staged or regs")
    return value


# The options that leave combinations of (dtype, head size, block size, cache) out of the grid.
NARROWING_KEYS = ("dtypes", "head_sizes", "block_sizes", "fp8")


def grid(request: common.Request) -> Grid:
    backend = request.options.get("backend", "cuda")
    if backend not in ("cuda", "rocm"):
        raise SystemExit(f"generator option backend={backend!r}: expected cuda or rocm")
    dtypes = request.option_list("dtypes", [d.name for d in DTYPES])
    heads = request.option_list("head_sizes", HEAD_SIZES)
    blocks = request.option_list("block_sizes", BLOCK_SIZES)
    # kernels/common/fp8.h has no ROCm conversions yet.
    fp8 = switch(request, "fp8", True) and backend == "cuda"
    return Grid(
        dtypes=[d for d in DTYPES if d.name in dtypes],
        head_sizes=[int(h) for h in heads],
        block_sizes=[int(b) for b in blocks],
        caches=[c for c in CACHES if c.name == "auto" or fp8],
        xl=switch(request, "xl", True),
        wide=switch(request, "wide", True),
        min_blocks=min_blocks(request),
        staged=kernel(request) in ("staged", "mma") and backend == "cuda",
        mma=kernel(request) == "mma" and backend == "cuda",
    )


def render(request: common.Request) -> dict[str, str]:
    env = common.environment()
    g = grid(request)
    files = {}
    instance = env.get_template(TEMPLATES[0])
    for dtype in g.dtypes:
        for head in g.head_sizes:
            files[f"paged_attention_{dtype.name}_h{head}.cu"] = instance.render(
                banner=common.banner(Path(__file__), TEMPLATES[0]),
                dtype=dtype,
                head=head,
                block_sizes=g.block_sizes,
                caches=g.caches,
                min_blocks=g.min_blocks,
                staged=g.staged,
                mma=g.mma,
                xl=g.xl,
                wide=g.wide,
            )
    files["paged_attention_dispatch.cu"] = env.get_template(TEMPLATES[1]).render(
        banner=common.banner(Path(__file__), TEMPLATES[1]),
        grid=g,
        # Whether options cut the grid: only then does a combination missing from it say so
        # (tests skip on that message; at the default grid a missing one is a bug to report).
        narrowed=any(key in request.options for key in NARROWING_KEYS),
    )
    return files


if __name__ == "__main__":
    common.main(__file__, TEMPLATES, render, OPTION_KEYS)
