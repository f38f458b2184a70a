"""`python -m aphrodite_ext info`: what this install holds and whether each op runs here."""

import json
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


def _info(backend, torch_full, cuda=""):
    return {
        "backend": backend,
        "torch": {"version": torch_full.split("+")[0], "full": torch_full, "cuda": cuda},
    }


@pytest.mark.parametrize(
    "info, running, cuda, match",
    [
        (_info("cpu", "2.13.0+cpu"), "2.14.1+cpu", None, "built against torch 2.13.0"),
        (_info("cuda", "2.14.1+cu130", "13.0"), "2.14.1+cpu", "", "built for CUDA"),
        (_info("cuda", "2.14.1+cu130", "13.0"), "2.14.0+cu126", "12.6", "CUDA major version"),
    ],
)
def test_an_install_that_cannot_run_under_this_torch_says_so(info, running, cuda, match):
    with pytest.raises(aphrodite_ext.BuildMismatchError, match=match):
        aphrodite_ext.check_build_info(info, torch_version=running, torch_cuda=cuda)


@pytest.mark.parametrize(
    "info, running, cuda",
    [
        (_info("cpu", "2.14.1+cpu"), "2.14.0+cu130", "13.0"),
        (_info("cuda", "2.14.1+cu130", "13.0"), "2.14.0+cu132", "13.2"),
    ],
)
def test_an_install_that_can_run_passes(info, running, cuda):
    aphrodite_ext.check_build_info(info, torch_version=running, torch_cuda=cuda)


def _mismatch(*args, **kwargs):
    raise aphrodite_ext.BuildMismatchError("aphrodite_ext was built against torch 0.1")


def _unbuilt_module() -> str:
    """An extension module this build skipped and nothing imported (its imports reach the
    finders every time); skips the test where every module is built."""
    unbuilt = next(
        (m for m in aphrodite_ext.MODULES if not aphrodite_ext.module_status(m)[0]), None
    )
    if unbuilt is None or f"aphrodite_ext.{unbuilt}" in sys.modules:
        pytest.skip("every extension module is built here")
    return unbuilt


def test_a_module_the_build_skipped_is_refused_even_if_a_file_is_left(built, monkeypatch, tmp_path):
    # A module of another backend's earlier build can be left in the package directory: the
    # recorded build decides, not the file.
    unbuilt = _unbuilt_module()
    (tmp_path / f"{unbuilt}.py").write_text("raise AssertionError('a left-over module loaded')\n")
    monkeypatch.setattr(aphrodite_ext, "__path__", [*aphrodite_ext.__path__, str(tmp_path)])
    with pytest.raises(ImportError, match=f"aphrodite_ext.{unbuilt} is not available: "):
        aphrodite_ext.load(unbuilt)


def test_a_module_import_checks_the_build_first(monkeypatch):
    unbuilt = _unbuilt_module()
    monkeypatch.setattr(aphrodite_ext, "check_build_info", _mismatch)
    with pytest.raises(aphrodite_ext.BuildMismatchError, match="built against torch 0.1"):
        aphrodite_ext.load(unbuilt)
    monkeypatch.undo()
    with pytest.raises(ImportError, match=f"aphrodite_ext.{unbuilt} is not available: ") as err:
        aphrodite_ext.load(unbuilt)
    assert not isinstance(err.value, aphrodite_ext.BuildMismatchError)


def test_info_under_another_torch_says_why_nothing_loads(built, monkeypatch):
    from aphrodite_ext import __main__ as cli

    monkeypatch.setattr(aphrodite_ext, "check_build_info", _mismatch)
    out = cli.info_text()
    assert "no module can load: aphrodite_ext was built against torch 0.1" in out
    rows = [ln for ln in out.splitlines() if ln.startswith(("_C ", "_moe_C "))]
    assert rows
    for row in rows:
        assert "available" not in row.replace("unavailable", ""), row
    built_rows = [r for r in rows if "built for another torch" in r]
    assert len(built_rows) == sum(
        len(f["ops"])
        for f in built["families"].values()
        if f["built"] and f["module"] in ("_C", "_moe_C")
    )


def test_plan_reads_a_plan_file(tmp_path, capsys):
    from aphrodite_ext import __main__ as cli

    plan = {
        "backend": "cuda",
        "archs": ["8.0", "9.0a"],
        "torch": {"full": "9.9.9+cu999"},
        "toolchain": {"build_type": "Release"},
        "families": {
            "marlin": {
                "module": "_C",
                "built": True,
                "archs": ["8.0", "9.0a"],
                "sources": ["a", "b"],
                "generator_options": ["dtypes=bf16", "groups=grouped"],
            },
            "rocm_only": {
                "module": "_rocm_C",
                "built": False,
                "reason": "needs ROCm",
                "sources": [],
            },
        },
        "modules": {"_C": {"built": True}, "_rocm_C": {"built": False, "reason": "needs ROCm"}},
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert cli.main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "backend cuda, archs 8.0 9.0a, torch 9.9.9+cu999, Release" in out
    assert "marlin" in out and "built: 8.0 9.0a (dtypes=bf16; groups=grouped)" in out
    assert "skipped: needs ROCm" in out


def test_runtime_knob_values_checked(built):
    """A run-time knob set to a value it does not take stops the module's import with a message
    that names the knob and its values; the values it takes load."""

    modules = [name for name in aphrodite_ext.MODULES if aphrodite_ext.module_status(name)[0]]
    if not modules:
        pytest.skip("this build has no extension module")

    def load(value):
        code = f"import aphrodite_ext; aphrodite_ext.load({modules[0]!r})"
        env = {**os.environ, "APHRODITE_PDL": value}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)

    bad = load("yes")
    assert bad.returncode != 0
    assert "APHRODITE_PDL='yes': expected one of 0, 1 (or unset)" in bad.stderr
    # `info` says so instead of loading anything.
    assert "no module can load: APHRODITE_PDL='yes'" in info(APHRODITE_PDL="yes")
    for value in aphrodite_ext.RUNTIME_KNOBS["APHRODITE_PDL"]:
        ok = load(value)
        assert ok.returncode == 0, ok.stderr


def test_family_status(built):
    """family_status says what the build info says of each family, and why one is missing."""
    for name, family in built["families"].items():
        ok, why = aphrodite_ext.family_status(name)
        assert ok == family["built"]
        assert (why == "") == ok and (ok or family["reason"] in why)
    ok, why = aphrodite_ext.family_status("no_such_family")
    assert not ok and "not a kernel family" in why
