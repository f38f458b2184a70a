"""The CUDA backend's plan across a matrix of requested archs: CMake configures (nothing
compiles) and records, per family, the archs it is built for, and per source its flags. Needs
nvcc and a CUDA build of torch; skips otherwise (APHRODITE_PLAN_REQUIRED=1 makes that an error:
the `cuda` nox session sets it, and CI sets it for the tests session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import build_options

BuildOptionError, find_cmake, find_nvcc = (
    build_options.BuildOptionError,
    build_options.find_cmake,
    build_options.find_nvcc,
)

ROOT = Path(__file__).resolve().parents[2]
CORE = [
    "activation",
    "layernorm",
    "topk_softmax",
    "moe_align",
    "moe_sum",
    "rotary",
    "cache",
    "fp8_quant",
]

# requested -> the archs every core family is built for.
MATRIX = [
    ("7.5", "7.5"),
    ("8.0 8.6", "8.0 8.6"),
    ("8.9 9.0a", "8.9 9.0a"),
    ("10.0a 12.0", "10.0a 12.0"),
    ("7.5 8.0 8.6 8.9 9.0a 10.0a 12.0+PTX", "7.5 8.0 8.6 8.9 9.0a 10.0a 12.0+PTX"),
    ("8.7", "8.7"),
]


def _skip_reason():
    if not torch.version.cuda:
        return f"torch {torch.__version__} is not a CUDA build"
    if find_nvcc() is None:
        return "no nvcc"
    try:
        find_cmake()
    except BuildOptionError as e:
        return str(e)
    return None


REASON = _skip_reason()
if REASON and os.environ.get("APHRODITE_PLAN_REQUIRED"):
    raise RuntimeError(f"the plan checks are required here but cannot run: {REASON}")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def configure(tmp_path, archs, *extra):
    build = tmp_path / "build"
    proc = subprocess.run(
        [
            find_cmake(),
            "-S",
            str(ROOT),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DAPHRODITE_TARGET_DEVICE=cuda",
            f"-DTORCH_CUDA_ARCH_LIST={archs}",
            f"-DCMAKE_CUDA_COMPILER={find_nvcc()}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    return proc, build


@pytest.mark.parametrize("requested, built", MATRIX)
def test_arch_matrix(tmp_path, requested, built):
    proc, build = configure(tmp_path, requested)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((build / "plan.json").read_text())
    assert plan["archs"] == requested.split() or sorted(plan["archs"]) == sorted(requested.split())
    for family in CORE:
        fam = plan["families"][family]
        assert fam["built"] and fam["archs"] == built.split(), (family, fam)
        for src in fam["sources"]:
            codes = {f.rsplit("code=", 1)[1] for f in src["flags"]}
            for arch in built.split():
                num = arch.replace(".", "").replace("+PTX", "")
                assert f"sm_{num}" in codes
                if arch.endswith("+PTX"):
                    assert f"compute_{num}" in codes
    assert plan["modules"]["_C"]["built"] and plan["modules"]["_moe_C"]["built"]
    # _fa2_C holds the CuTe flash-attention family: built where its archs meet the requested
    # ones and CUTLASS's headers were found; otherwise the plan says which of the two is missing.
    fa2 = plan["families"]["flash_attn"]
    assert plan["modules"]["_fa2_C"]["built"] == fa2["built"]
    if fa2["built"]:
        assert fa2["archs"] and len(fa2["sources"]) >= 2, fa2
    elif "none of which serves" not in fa2["reason"]:
        for way in ("nvidia-cutlass", "APHRODITE_CUTLASS_SRC_DIR", "APHRODITE_CUTLASS_FETCH"):
            assert way in fa2["reason"], fa2
    assert not plan["modules"]["_rocm_C"]["built"]
    assert "exists on rocm only" in plan["modules"]["_rocm_C"]["reason"]
    generated = [s for s in plan["families"]["activation"]["sources"] if "generated" in s["path"]]
    assert len(generated) == 10


def test_a_plain_arch_beside_its_a_variant_is_compiled_once(tmp_path):
    # 9.0a code runs on every 9.0 GPU: "9.0 9.0a" compiles 9.0a only, and configure says so.
    proc, build = configure(tmp_path, "8.0 9.0 9.0a")
    assert proc.returncode == 0, proc.stderr
    assert "9.0 is compiled as 9.0a only" in proc.stdout
    plan = json.loads((build / "plan.json").read_text())
    assert plan["archs"] == ["8.0", "9.0a"]
    for family in CORE:
        assert plan["families"][family]["archs"] == ["8.0", "9.0a"], family
        for src in plan["families"][family]["sources"]:
            codes = {f.rsplit("code=", 1)[1] for f in src["flags"]}
            assert "sm_90" not in codes and "sm_90a" in codes, src


def test_disabled_family_is_recorded_with_its_reason(tmp_path):
    proc, build = configure(tmp_path, "9.0a", "-DAPHRODITE_DISABLE_FAMILIES=topk_softmax")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((build / "plan.json").read_text())
    fam = plan["families"]["topk_softmax"]
    assert not fam["built"] and "APHRODITE_DISABLE_FAMILIES" in fam["reason"]
    moe = plan["modules"]["_moe_C"]
    assert moe["built"] and "topk_softmax" not in moe["built_families"]

    # With every family of _moe_C disabled, the module itself is skipped, and says why.
    moe_families = sorted(f for f, v in plan["families"].items() if v["module"] == "_moe_C")
    proc, build = configure(
        tmp_path / "all", "9.0a", f"-DAPHRODITE_DISABLE_FAMILIES={';'.join(moe_families)}"
    )
    assert proc.returncode == 0, proc.stderr
    moe = json.loads((build / "plan.json").read_text())["modules"]["_moe_C"]
    assert not moe["built"] and "none of its families" in moe["reason"]


@pytest.mark.parametrize(
    "options, message",
    [
        ("marln.dtypes=bf16", "names 'marln', which is not a kernel family"),
        ("layernorm.dtypes=bf16", "the layernorm family has no generator"),
        ("marlin.dtype=bf16", "unknown generator option(s) dtype"),
        ("paged_attention.backend=rocm", "a generator's backend is the build's"),
        ("activation.dtypes=bf16;activation.dtypes=f16", "dtypes is given twice"),
    ],
)
def test_cmake_rejects_generator_options_that_would_be_ignored(tmp_path, options, message):
    # Each would leave the grid it meant to narrow at full size: configure stops and says why.
    proc, build = configure(tmp_path, "9.0a", f"-DAPHRODITE_GENERATOR_OPTIONS={options}")
    assert proc.returncode != 0 and message in " ".join(proc.stderr.split())
    assert not (build / "plan.json").exists()


def test_cmake_rejects_a_build_with_no_family_left(tmp_path):
    families = sorted(
        json.loads((configure(tmp_path / "all", "9.0a")[1] / "plan.json").read_text())["families"]
    )
    proc, _ = configure(tmp_path, "9.0a", f"-DAPHRODITE_DISABLE_FAMILIES={';'.join(families)}")
    assert proc.returncode != 0
    assert "no kernel family is left to build" in " ".join(proc.stderr.split())


@pytest.mark.parametrize(
    "archs, message",
    [
        ("9.1", "'9.1' is not a CUDA arch"),
        ("7.0", "cannot compile CUDA arch(s) 7.0"),
    ],
)
def test_cmake_rejects_bad_archs_at_configure(tmp_path, archs, message):
    proc, _ = configure(tmp_path, archs)
    assert proc.returncode != 0 and message in proc.stderr.replace("\n", " ")


def test_cmake_rejects_unknown_device(tmp_path):
    proc = subprocess.run(
        [find_cmake(), "-S", str(ROOT), "-B", str(tmp_path / "b"), "-DAPHRODITE_TARGET_DEVICE=tpu"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "not a backend; use one of: auto, cuda, rocm, cpu" in " ".join(proc.stderr.split())


@pytest.mark.parametrize(
    "requested, built, options, files",
    [
        ("7.5 8.0 8.6 8.9 9.0a 10.0a 12.0+PTX", "8.0 8.6 8.9 9.0a 10.0a 12.0+PTX", "", 64 + 1),
        ("8.0 9.0 12.0", "8.0 9.0 12.0", "", 32 + 1),
        ("9.0a", "9.0a", "marlin.dtypes=bf16;marlin.groups=grouped", 2 * 8 + 1),
        ("7.5", "", "", 0),
    ],
)
def test_marlin_family_archs_and_grid(tmp_path, requested, built, options, files):
    # Marlin needs sm_80+ (mma.sync bf16, cp.async): 7.5 alone skips it with its reason; the
    # generator options narrow the instantiation grid (files = instances + the dispatch table):
    # 32 mma.sync instances by default, and the 32 sm_90a ones (24 wgmma, 8 TMA-fed decode)
    # where the family is built for 9.0a.
    proc, build = configure(tmp_path, requested, f"-DAPHRODITE_GENERATOR_OPTIONS={options}")
    assert proc.returncode == 0, proc.stderr
    fam = json.loads((build / "plan.json").read_text())["families"]["marlin"]
    assert fam["archs"] == built.split() and fam["built"] == bool(built), fam
    if not built:
        assert "8.0" in fam["reason"] and "7.5" in fam["reason"]
    generated = [s for s in fam["sources"] if "generated" in s["path"]]
    assert len(generated) == files
    # The plan records the options that narrowed the family (the entries for it, without its
    # name), and none for a family no entry names.
    assert fam["generator_options"] == [o.split(".", 1)[1] for o in options.split(";") if o]
    rotary = json.loads((build / "plan.json").read_text())["families"]["rotary"]
    assert rotary["generator_options"] == []
