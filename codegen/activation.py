"""Generates the activation family's GPU instantiations: one translation unit per
(activation, dtype), so the family compiles in parallel, and the dispatch that picks one.

Options (APHRODITE_GENERATOR_OPTIONS="activation.dtypes=bf16,f16"):
  dtypes   which element types to instantiate (default: all of DTYPES)
  kinds    which activations to instantiate (default: all of KINDS)
  backend  cuda or rocm (set by the build)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


@dataclass(frozen=True)
class Kind:
    name: str  # file-name and option spelling
    enum: str  # activation::Kind enumerator


@dataclass(frozen=True)
class DType:
    name: str
    cpp: str  # device element type
    enum: str  # ScalarType enumerator


KINDS = [Kind("silu", "kSilu"), Kind("gelu", "kGelu"), Kind("gelu_tanh", "kGeluTanh")]
DTYPES = [
    DType("f32", "float", "kFloat32"),
    DType("f16", "__half", "kFloat16"),
    DType("bf16", "__nv_bfloat16", "kBFloat16"),
]
# The keys of the Options above (common.main rejects any other).
OPTION_KEYS = ("dtypes", "kinds")
TEMPLATES = ["activation_instance.cu.j2", "activation_dispatch.cu.j2"]


def grid(request: common.Request) -> list[tuple[Kind, DType]]:
    kinds = request.option_list("kinds", [k.name for k in KINDS])
    dtypes = request.option_list("dtypes", [d.name for d in DTYPES])
    return [(k, d) for k in KINDS if k.name in kinds for d in DTYPES if d.name in dtypes]


def render(request: common.Request) -> dict[str, str]:
    env = common.environment()
    instances = grid(request)
    files = {}
    instance = env.get_template(TEMPLATES[0])
    for kind, dtype in instances:
        files[f"activation_{kind.name}_{dtype.name}.cu"] = instance.render(
            banner=common.banner(Path(__file__), TEMPLATES[0]), kind=kind, dtype=dtype
        )
    files["activation_dispatch.cu"] = env.get_template(TEMPLATES[1]).render(
        banner=common.banner(Path(__file__), TEMPLATES[1]), instances=instances
    )
    return files


if __name__ == "__main__":
    common.main(__file__, TEMPLATES, render, OPTION_KEYS)
