"""Generates the marlin family's GPU instantiations: one translation unit per (activation dtype,
weight type, group mode, thread-block shape), so the family compiles in parallel, and the
dispatch that picks an instantiation and a split-K factor for a problem at run time.

Options (APHRODITE_GENERATOR_OPTIONS="marlin.dtypes=bf16;marlin.groups=grouped"):
  dtypes   activation types to instantiate (default: all of DTYPES)
  weights  weight types to instantiate (default: all of WEIGHTS)
  groups   group modes: grouped (group sizes 32/64/128, one kernel) and/or channel
  shapes   thread-block shapes, any of SHAPES (default: DEFAULT_SHAPES, without the k-split
           ones); the dispatch uses those built
  backend  cuda (set by the build)
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


@dataclass(frozen=True)
class DType:
    name: str
    cpp: str  # device element type
    enum: str  # ScalarType enumerator


@dataclass(frozen=True)
class Weight:
    name: str
    enum: str  # WeightType enumerator


@dataclass(frozen=True)
class Group:
    name: str
    grouped: bool  # scales per group of rows (True) or one per channel (False)


class Engine(enum.Enum):
    """How a block's main loop multiplies and is fed: marlin.h's Engine, each member valued by
    its C++ enumerator's name."""

    # mma.sync, every thread copying its chunks of a stage with cp.async (sm_80 and newer)
    MMA_SYNC = "kMmaSync"
    # sm_90a: the same mma.sync loop, fed by a producer warp through TMA (the decode block)
    MMA_SYNC_TMA = "kMmaSyncTma"
    # sm_90a warpgroup MMA (wgmma): m_warps = 2 warpgroups of n_warps = 4 warps, each warpgroup
    # multiplying half of every warp's 64 columns for all the block's rows
    WGMMA = "kWgmma"

    @property
    def cpp(self) -> str:
        """The C++ enumerator, as the generated sources spell it."""
        return f"Engine::{self.value}"

    @property
    def suffix(self) -> str:
        """What the engine adds to a shape's name (APHRODITE_MARLIN_CONFIG reads it back)."""
        return {Engine.MMA_SYNC: "", Engine.MMA_SYNC_TMA: "t", Engine.WGMMA: "w"}[self]

    @property
    def sm90a(self) -> bool:
        """Whether it needs the arch-specific sm_90a target (wgmma, TMA)."""
        return self is not Engine.MMA_SYNC


@dataclass(frozen=True)
class Shape:
    """A thread block of k_warps x m_warps x n_warps warps, each 16*m_tiles rows x 64 columns;
    the k_warps groups share the block's tile and split each k slice (reduced in the block)."""

    m_tiles: int
    m_warps: int
    n_warps: int
    k_warps: int = 1
    engine: Engine = Engine.MMA_SYNC

    def __post_init__(self) -> None:
        if not isinstance(self.engine, Engine):
            raise TypeError(f"Shape.engine must be an Engine, got {self.engine!r}")

    @property
    def rows(self) -> int:
        return 16 * self.m_tiles * self.m_warps

    @property
    def name(self) -> str:
        k = f"k{self.k_warps}" if self.k_warps > 1 else ""
        return f"m{self.rows}n{64 * self.n_warps}{k}{self.engine.suffix}"

    @property
    def sm90a(self) -> bool:
        """Whether the block needs the arch-specific sm_90a target (wgmma, TMA)."""
        return self.engine.sm90a


DTYPES = [DType("f16", "__half", "kFloat16"), DType("bf16", "__nv_bfloat16", "kBFloat16")]
WEIGHTS = [Weight("uint4b8", "kUint4b8"), Weight("uint4", "kUint4")]
GROUPS = [Group("grouped", True), Group("channel", False)]
# Decode (M <= 16), small batches (M <= 32, <= 64) and prefill (M > 64). The k2 shapes are the
# 32- and 64-row blocks with twice the warps (8: two k groups of 4), for the sweep to weigh
# against their 4-warp twins; the dispatch's heuristic picks among the k1 shapes only, so the
# k2 shapes are built only where the shapes option names them (DEFAULT_SHAPES leaves them out:
# an H200 sweep at M <= 16 found them slower everywhere, M = 32..128 is not measured yet).
SHAPES = [
    Shape(1, 1, 4),
    Shape(1, 1, 4, engine=Engine.MMA_SYNC_TMA),
    Shape(2, 1, 4),
    Shape(2, 1, 4, 2),
    Shape(4, 1, 4),
    Shape(4, 1, 4, 2),
    Shape(4, 2, 4),
    Shape(1, 2, 4, engine=Engine.WGMMA),
    Shape(2, 2, 4, engine=Engine.WGMMA),
    Shape(4, 2, 4, engine=Engine.WGMMA),
]
DEFAULT_SHAPES = [s for s in SHAPES if s.k_warps == 1]
# The wgmma and TMA-fed blocks need the arch-specific sm_90a target (wgmma and the tensor-map
# copies are not in plain sm_90): they are generated only when the family is built for 9.0a;
# other archs of the same build compile them to a trap that the dispatch never launches (it
# checks the device is sm_90).
WGMMA_ARCH = "9.0a"
# The keys of the Options above (common.main rejects any other).
OPTION_KEYS = ("dtypes", "weights", "groups", "shapes")
TEMPLATES = ["marlin_instance.cu.j2", "marlin_dispatch.cu.j2"]


def grid(request: common.Request) -> list[tuple[DType, Weight, Group, Shape]]:
    if request.options.get("backend", "cuda") != "cuda":
        raise SystemExit("codegen/marlin.py: the marlin family is CUDA-only (mma.sync, cp.async)")
    dtypes = request.option_list("dtypes", [d.name for d in DTYPES])
    weights = request.option_list("weights", [w.name for w in WEIGHTS])
    groups = request.option_list("groups", [g.name for g in GROUPS])
    shapes = request.option_list(
        "shapes", [s.name for s in SHAPES], default=[s.name for s in DEFAULT_SHAPES]
    )
    if not any(a.split("+")[0] == WGMMA_ARCH for a in request.archs):
        sm90a = [s.name for s in SHAPES if s.sm90a and s.name in shapes]
        if "shapes" in request.options and sm90a:
            raise SystemExit(
                f"generator option shapes: {','.join(sm90a)} need(s) the {WGMMA_ARCH} target, "
                f"which the family's archs ({' '.join(request.archs) or 'none'}) leave out: "
                f"request {WGMMA_ARCH} (e.g. TORCH_CUDA_ARCH_LIST=9.0a) or drop them"
            )
        shapes = [name for name in shapes if name not in sm90a]
    return [
        (d, w, g, s)
        for d in DTYPES
        if d.name in dtypes
        for w in WEIGHTS
        if w.name in weights
        for g in GROUPS
        if g.name in groups
        for s in SHAPES
        if s.name in shapes
    ]


def template_args(dtype: DType, weight: Weight, group: Group, shape: Shape) -> str:
    """The template arguments of launch_gemm_instance<> for one grid point."""
    grouped = "true" if group.grouped else "false"
    return (
        f"{dtype.cpp}, WeightType::{weight.enum}, {grouped}, "
        f"{shape.m_tiles}, {shape.m_warps}, {shape.n_warps}, {shape.k_warps}, "
        f"{shape.engine.cpp}"
    )


def render(request: common.Request) -> dict[str, str]:
    env = common.environment()
    instances = grid(request)
    files = {}
    instance = env.get_template(TEMPLATES[0])
    for dtype, weight, group, shape in instances:
        name = f"marlin_{dtype.name}_{weight.name}_{group.name}_{shape.name}.cu"
        files[name] = instance.render(
            banner=common.banner(Path(__file__), TEMPLATES[0]),
            dtype=dtype,
            weight=weight,
            group=group,
            shape=shape,
            args=template_args(dtype, weight, group, shape),
        )
    files["marlin_dispatch.cu"] = env.get_template(TEMPLATES[1]).render(
        banner=common.banner(Path(__file__), TEMPLATES[1]),
        instances=[(*i, template_args(*i)) for i in instances],
        shapes=[s for s in SHAPES if any(s == i[3] for i in instances)],
    )
    return files


if __name__ == "__main__":
    common.main(__file__, TEMPLATES, render, OPTION_KEYS)
