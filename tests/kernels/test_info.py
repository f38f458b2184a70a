"""`python -m aphrodite_ext info`: what this install holds and whether each op runs here."""

import os
import subprocess
import sys

import pytest

import aphrodite_ext


def info(**env):
    proc = subprocess.run(
        [sys.executable, "-m", "aphrodite_ext", "info"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def built():
    build = aphrodite_ext.build_info()
    if not build:
        pytest.skip("aphrodite_ext is not built here")
    return build


def test_every_op_is_listed(built):
    out = info()
    for family, fam in built["families"].items():
        for op in fam["ops"]:
            line = next((ln for ln in out.splitlines() if f" {op} " in f" {ln} "), None)
            assert line is not None and family in line, (op, out)


def test_a_cpu_isa_this_machine_cannot_run_marks_the_ops_unavailable(built):
    if built["backend"] != "cpu":
        pytest.skip("APHRODITE_CPU_ISA chooses among the CPU backend's builds")
    out = info(APHRODITE_CPU_ISA="AVX2")
    assert "_C: CPU kernels cannot run: APHRODITE_CPU_ISA=AVX2 is not an ISA" in out
    rows = [ln for ln in out.splitlines() if " silu_and_mul " in f" {ln} "]
    assert rows and "unavailable: APHRODITE_CPU_ISA=AVX2" in rows[0]
    assert "CPU kernels run the" in info(APHRODITE_CPU_ISA="scalar")
