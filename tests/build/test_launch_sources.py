"""kernels/common/launch.cuh's contract, checked on the sources: a kernel that launch_kernel()
launches may start before the kernel ahead of it in the stream has finished (programmatic
dependent launch), so it must begin with pdl_prologue() or pdl_wait(), which wait for that kernel.
In every source that includes launch.cuh or calls launch_kernel, each __global__ function's body
starts with one of them (after pdl_wait(), the body also lets its dependents go with
pdl_launch_dependents(): without it they would start only when the grid has exited, later than a
plain launch would), and no kernel is launched with <<<...>>> (which would bypass the choice of
attributes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
INCLUDE = '#include "common/launch.cuh"'
# What a source that launches with PDL calls: launch_kernel, or (marlin's own launches)
# use_pdl / pdl_attribute.
CALLS = ("launch_kernel<", "use_pdl<", "pdl_attribute(")


def _sources() -> list[Path]:
    return sorted(
        p
        for p in KERNELS.rglob("*")
        if p.suffix in (".cu", ".cuh")
        and p.name != "launch.cuh"
        and (INCLUDE in p.read_text() or any(c in p.read_text() for c in CALLS))
    )


def _body(text: str) -> str:
    """`text` (what follows a function's opening brace) up to the matching closing brace, with
    // comments blanked out."""
    code = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    depth = 1
    for i, c in enumerate(code):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth == 0:
            return code[:i]
    raise AssertionError("a kernel's body has no closing brace this check can find")


def _kernel_bodies(text: str) -> list[tuple[str, str]]:
    """(name, body) of each __global__ function defined in `text`."""
    found = []
    for m in re.finditer(r"__global__\b(.*?)\{", text, re.S):
        name = re.findall(r"(\w+)\s*\(", m.group(1))
        if name:
            found.append(
                (name[-1] if name[-1] != "__launch_bounds__" else name[0], _body(text[m.end() :]))
            )
    return found


def test_the_pdl_sources_are_found():
    names = {p.name for p in _sources()}
    assert {
        "cache.cu",
        "fp8_quant.cu",
        "layernorm.cu",
        "activation_kernels.cuh",
        "paged_attention_kernels.cuh",
        "paged_attention_mma.cuh",
        "paged_attention_launch.cuh",
        "marlin_gemm.cuh",
    } <= names


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(KERNELS)))
def test_every_kernel_begins_with_the_prologue(path):
    text = path.read_text()
    kernels = _kernel_bodies(text)
    assert kernels or any(c in text for c in CALLS), (
        f"{path.name} includes launch.cuh but neither defines nor launches a kernel"
    )
    for name, body in kernels:
        # The prologue comes before any statement that could reach global memory; only index
        # arithmetic on the built-in variables (no loads) may precede it.
        head = re.split(r"pdl_(?:prologue|wait)\(\);", body, maxsplit=1)
        assert len(head) == 2, (
            f"{path.name}: kernel {name} calls neither pdl_prologue() nor pdl_wait()"
        )
        if "pdl_prologue();" not in body:
            assert "pdl_launch_dependents();" in head[1], (
                f"{path.name}: kernel {name} waits (pdl_wait) but never lets its dependents go"
            )
        assert head[0].count("{") == head[0].count("}"), (
            f"{path.name}: kernel {name} waits inside a block: every thread must wait"
        )
        before = [s.strip() for s in head[0].split(";") if s.strip()]
        for statement in before:
            code = re.sub(r"//[^\n]*", "", statement).strip()
            if not code:
                continue
            assert not re.search(
                r"\*\s*\w+\.|\[|->|\bload|\bstore|atomic|^(if|for|while|switch)\b|\?", code
            ) and re.search(
                r"\b(threadIdx|blockIdx|blockDim|using|static_assert|constexpr)\b", code
            ), f"{path.name}: kernel {name} runs `{code}` before pdl_prologue()"
    assert "<<<" not in text, f"{path.name} launches a kernel with <<<>>>: use launch_kernel"
