"""Generates the flash_attn family's GPU instantiations: one translation unit per (head dim,
dtype, causal or not, dense or paged K/V), each instantiating flash_fwd_launch (kernels/
flash_attn/flash_fwd_kernel.cuh) once, and the dispatch that implements launch_fwd (kernels/
flash_attn/flash_attn.h) and names the head dims a build holds.

Options (APHRODITE_GENERATOR_OPTIONS="flash_attn.head_dims=128;flash_attn.dtypes=bf16"):
  head_dims  which head dims to instantiate (default: all of HEAD_DIMS)
  dtypes     which dtypes (default: all of DTYPES)
  causal     which masks: a subset of off,on (default both)
  paged      which K/V layouts: a subset of off,on (default both); off drops the block-table
             (paged KV cache) variant, on keeps only it
  block_m    query rows per CTA at given head dims, as head_dim:rows pairs (rows 64 or 128;
             "block_m=128:64"); a head dim not named keeps the kernel's default_block_m (128 up
             to head dim 128, else 64). For comparing tile shapes on a GPU: the file names stay,
             the content (and so the build) changes
  backend    cuda (set by the build; the family has no ROCm path)

Cost: one CuTe instantiation is one nvcc run of about a minute per arch here; the full grid is
5 head dims x 2 dtypes x 2 masks x 2 layouts = 40 files. CI narrows it to 2 (dense and paged).
Sliding windows are a run-time argument of every instantiation; each file holds two kernels,
without and with the logit softcap (picked at launch: the tanh code slowed the plain forward),
and a paged file each of them twice: for block sizes that are multiples of the 64-row K/V tile
and for the others (also picked at launch; the four-kernel file took 44 s against 39 s for two,
bf16 head dim 128, sm_90a).
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
    cpp: str  # CuTe element type
    enum: str  # ScalarType enumerator


DTYPES = [
    DType("f16", "cute::half_t", "kFloat16"),
    DType("bf16", "cute::bfloat16_t", "kBFloat16"),
]
# Multiples of 32 (the kernel's shared-memory tiling); 64 and 128 are the common ones.
HEAD_DIMS = ["64", "96", "128", "192", "256"]
BLOCK_M = ["64", "128"]
CAUSAL = ["off", "on"]
PAGED = ["off", "on"]
# The keys of the Options above (common.main rejects any other).
OPTION_KEYS = ("head_dims", "dtypes", "causal", "paged", "block_m")
TEMPLATES = ["flash_attn_instance.cu.j2", "flash_attn_dispatch.cu.j2"]


@dataclass(frozen=True)
class Instance:
    head_dim: int
    dtype: DType
    causal: bool
    paged: bool
    block_m: int = 0  # 0: the kernel's default_block_m(head_dim)

    @property
    def launch_args(self) -> str:
        args = [
            str(self.head_dim),
            self.dtype.cpp,
            "true" if self.causal else "false",
            "true" if self.paged else "false",
        ]
        if self.block_m:
            args.append(str(self.block_m))
        return ", ".join(args)

    @property
    def file(self) -> str:
        mask = "causal" if self.causal else "full"
        layout = "_paged" if self.paged else ""
        return f"flash_fwd_h{self.head_dim}_{self.dtype.name}_{mask}{layout}.cu"


def block_m_overrides(value: str | None) -> dict[int, int]:
    """The block_m option ("128:128,96:64") as {head_dim: rows}."""
    if value is None:
        return {}
    out = {}
    for item in (v.strip() for v in value.split(",") if v.strip()):
        head, _, rows = item.partition(":")
        if head.strip() not in HEAD_DIMS or rows.strip() not in BLOCK_M:
            raise SystemExit(
                f"generator option block_m={value!r}: expected comma-separated head_dim:rows "
                f"pairs, head_dim one of {','.join(HEAD_DIMS)}, rows one of {','.join(BLOCK_M)}"
            )
        out[int(head)] = int(rows)
    return out


def instances(request: common.Request) -> list[Instance]:
    backend = request.options.get("backend", "cuda")
    if backend != "cuda":
        raise SystemExit(f"generator option backend={backend!r}: flash_attn is CUDA-only")
    heads = request.option_list("head_dims", HEAD_DIMS)
    dtypes = request.option_list("dtypes", [d.name for d in DTYPES])
    masks = request.option_list("causal", CAUSAL)
    layouts = request.option_list("paged", PAGED)
    block_m = block_m_overrides(request.options.get("block_m"))
    return [
        Instance(int(h), d, m == "on", pg == "on", block_m.get(int(h), 0))
        for h in heads
        for d in DTYPES
        if d.name in dtypes
        for m in masks
        for pg in layouts
    ]


def render(request: common.Request) -> dict[str, str]:
    env = common.environment()
    grid = instances(request)
    files = {}
    instance = env.get_template(TEMPLATES[0])
    for inst in grid:
        files[inst.file] = instance.render(
            banner=common.banner(Path(__file__), TEMPLATES[0]), inst=inst
        )
    head_dims = sorted({i.head_dim for i in grid})
    files["flash_fwd_dispatch.cu"] = env.get_template(TEMPLATES[1]).render(
        banner=common.banner(Path(__file__), TEMPLATES[1]),
        instances=grid,
        head_dims=", ".join(str(h) for h in head_dims),
    )
    return files


if __name__ == "__main__":
    common.main(__file__, TEMPLATES, render, OPTION_KEYS)
