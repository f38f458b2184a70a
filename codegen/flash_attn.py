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
  backend    cuda (set by the build; the family has no ROCm path)

Cost: one CuTe instantiation is one nvcc run of about a minute per arch here; the full grid is
5 head dims x 2 dtypes x 2 masks x 2 layouts = 40 files. CI narrows it to 2 (dense and paged).
Sliding windows are a run-time argument of every instantiation; each file holds two kernels,
without and with the logit softcap (picked at launch: the tanh code slowed the plain forward).
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
CAUSAL = ["off", "on"]
PAGED = ["off", "on"]
TEMPLATES = ["flash_attn_instance.cu.j2", "flash_attn_dispatch.cu.j2"]


@dataclass(frozen=True)
class Instance:
    head_dim: int
    dtype: DType
    causal: bool
    paged: bool

    @property
    def file(self) -> str:
        mask = "causal" if self.causal else "full"
        layout = "_paged" if self.paged else ""
        return f"flash_fwd_h{self.head_dim}_{self.dtype.name}_{mask}{layout}.cu"


def instances(request: common.Request) -> list[Instance]:
    backend = request.options.get("backend", "cuda")
    if backend != "cuda":
        raise SystemExit(f"generator option backend={backend!r}: flash_attn is CUDA-only")
    heads = request.option_list("head_dims", HEAD_DIMS)
    dtypes = request.option_list("dtypes", [d.name for d in DTYPES])
    masks = request.option_list("causal", CAUSAL)
    layouts = request.option_list("paged", PAGED)
    return [
        Instance(int(h), d, m == "on", pg == "on")
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
    common.main(__file__, TEMPLATES, render)
