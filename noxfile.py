"""Sessions per backend and task. `nox -s tests` is the README's test command and CI's.

Every session builds in its own virtualenv with the torch that `APHRODITE_TORCH` names
(default: plain `torch`, the newest release pip may install here).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
TORCH = os.environ.get("APHRODITE_TORCH", "torch")
BUILD_DEPS = ["setuptools>=70", "wheel", "cmake>=3.26", "ninja", "jinja2", "pytest", "numpy"]
# Arch sets the plan session configures, from one old GPU to a full release list.
PLAN_ARCH_SETS = ["7.5", "8.0 8.6", "8.9 9.0a", "10.0a 12.0", "7.5 8.0 8.6 8.9 9.0a 10.0a 12.0+PTX"]
nox.options.sessions = ["tests", "lint"]


def _install(session, device: str, **env) -> None:
    session.install(TORCH, *BUILD_DEPS)
    session.run(
        "pip",
        "install",
        "--no-build-isolation",
        "--no-deps",
        "-e",
        ".",
        env={"APHRODITE_TARGET_DEVICE": device, **env},
    )


def _usable_isas(session) -> list[str]:
    """The CPU ISA builds this machine can run, via the module's own choice."""
    out = (
        session.run(
            "python",
            "-c",
            "import aphrodite_ext, torch; aphrodite_ext.load('_C');print(torch.ops._C.cpu_isa())",
            silent=True,
        )
        .strip()
        .splitlines()[-1]
    )
    order = ["scalar", "avx2", "avx512"]
    return order[: order.index(out) + 1] if out in order else ["scalar"]


@nox.session
def tests(session):
    """Builds the CPU backend, then runs the build-system tests once and the kernel tests once
    per CPU ISA build this machine can run (APHRODITE_CPU_ISA), and checks the wheel
    (`pip wheel .`: abi3, only the built modules, runs when installed elsewhere)."""
    _install(session, "cpu")
    session.run("python", "-m", "aphrodite_ext", "info")
    session.run("python", "tools/check_wheel.py", env={"APHRODITE_TARGET_DEVICE": "cpu"})
    session.run("pytest", "-q", "tests/build", *session.posargs)
    for isa in _usable_isas(session):
        session.run(
            "pytest", "-q", "tests/kernels", *session.posargs, env={"APHRODITE_CPU_ISA": isa}
        )


@nox.session
def cuda(session):
    """CUDA backend on any machine with nvcc: a compile and link of every module for one arch
    (TORCH_CUDA_ARCH_LIST, default 9.0a), the arch-matrix plan checks; the kernel tests
    run where a GPU is visible and skip elsewhere. `nox -s cuda -- --skip-plan-checks` leaves
    the plan checks (tests/build/test_plan.py) to the tests session (CI runs both, and tells
    that one they must run); the flash-attention generator's checks run here either way."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0a")
    unknown = set(session.posargs) - {"--skip-plan-checks"}
    if unknown:
        session.error(f"cuda: unknown arguments {sorted(unknown)}; it takes --skip-plan-checks")
    # CUTLASS/CuTe headers for _fa2_C (cmake/cutlass.cmake finds them in the package); only
    # the headers are used, so none of its Python dependencies.
    session.install("--no-deps", "nvidia-cutlass")
    _install(session, "cuda", TORCH_CUDA_ARCH_LIST=arch)
    # The flash-attention generator's checks need the nvidia-cutlass package, which only this
    # session installs: they run here whatever the flag says.
    plan = [] if "--skip-plan-checks" in session.posargs else ["tests/build/test_plan.py"]
    session.run(
        "pytest",
        "-q",
        *plan,
        "tests/build/test_flash_attn_gen.py",
        env={"APHRODITE_PLAN_REQUIRED": "1"},
    )
    session.run("python", "-m", "aphrodite_ext", "plan")
    session.run(
        "python",
        "-c",
        "import aphrodite_ext._C, aphrodite_ext._moe_C, aphrodite_ext._fa2_C; "
        "print('CUDA modules import')",
    )
    session.run("pytest", "-q", "tests/kernels")


@nox.session
def plan(session):
    """Configures the CUDA backend (no compile) for each arch set and prints its plan."""
    session.install(TORCH, *BUILD_DEPS)
    nvcc = subprocess.run(
        [
            "python",
            "-c",
            "import shutil; print(shutil.which('nvcc') or '/usr/local/cuda/bin/nvcc')",
        ],
        capture_output=True,
        text=True,
    ).stdout
    for archs in session.posargs or PLAN_ARCH_SETS:
        build = ROOT / "build" / ("plan-" + archs.replace(" ", "_").replace("+", "p"))
        session.run(
            "cmake",
            "-S",
            ".",
            "-B",
            str(build),
            "-G",
            "Ninja",
            "--log-level=WARNING",
            "-DAPHRODITE_TARGET_DEVICE=cuda",
            f"-DTORCH_CUDA_ARCH_LIST={archs}",
            f"-DCMAKE_CUDA_COMPILER={nvcc.strip()}",
            silent=True,
        )
        session.run("python", "-m", "aphrodite_ext", "plan", str(build / "plan.json"))


@nox.session
def lint(session):
    """ruff (lint and format) over the Python; clang-format (.clang-format: Google style, 100
    columns) over the C++/CUDA, as a check that changes nothing."""
    session.install("ruff", "clang-format==23.1.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    files = subprocess.run(
        ["git", "ls-files", "*.h", "*.cpp", "*.cu", "*.cuh"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.split()
    session.run("clang-format", "--dry-run", "--Werror", "--style=file", *files)


@nox.session
def bench(session):
    """Kernel benchmarks on this machine's device; results to benchmarks/results/."""
    device = "cuda" if os.environ.get("APHRODITE_TARGET_DEVICE") == "cuda" else "cpu"
    _install(session, device)
    session.run("python", "benchmarks/bench_kernels.py", "--device", device)
