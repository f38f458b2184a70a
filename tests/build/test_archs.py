"""Golden tests for cmake/archs.cmake, run through tests/build/archs_driver.cmake.

Every list below is ";"-separated as in CMake; "" is the empty list.
Successful cases are batched into a few `cmake -P` runs; each error case needs
its own run because message(FATAL_ERROR) stops the script.
"""

import concurrent.futures
import functools
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# (supported, requested, expected) for aphrodite_cuda_archs_intersect.
INTERSECT_CASES = [
    # `a` suffix: arch-specific code only for exactly that arch.
    ("9.0a", "9.0a", "9.0a"),
    ("9.0a", "9.0", ""),
    ("9.0", "9.0a", "9.0a"),
    ("9.0;9.0a", "9.0a", "9.0a"),
    ("9.0;9.0a", "9.0", "9.0"),
    ("9.0a", "9.0a+PTX", "9.0a+PTX"),
    ("10.0a", "10.3a", ""),
    ("12.0", "12.0a", "12.0a"),
    ("12.0", "12.1a", "12.0"),
    ("12.0a", "12.0f", ""),
    # Plain 9.0 beside 9.0a is not compiled twice: 9.0a code serves every 9.0 GPU; 9.0+PTX
    # stays for its PTX. Plain 10.0 / 12.0 stay beside their `a` variants: they also serve the
    # later minors (10.3, 12.1), which `a` code does not.
    ("10.0", "10.0;10.0a", "10.0;10.0a"),
    ("12.0", "12.0a;12.1", "12.0;12.0a"),
    ("8.0;9.0;10.0", "10.0a;10.3", "10.0;10.0a"),
    ("12.0;12.0a", "12.0;12.0a", "12.0;12.0a"),
    ("9.0;9.0a", "9.0;9.0a", "9.0a"),
    ("8.0;9.0", "8.0;9.0;9.0a", "8.0;9.0a"),
    ("9.0", "9.0+PTX;9.0a", "9.0+PTX;9.0a"),
    ("9.0", "9.0;9.0a+PTX", "9.0a+PTX"),
    ("9.0a", "9.0;9.0a", "9.0a"),
    ("10.0;11.0", "11.0a", "11.0a"),
    # `f` suffix: family code serves the same or a later arch of its major.
    ("10.0f", "10.3", "10.0f"),
    ("10.0f", "12.1", ""),
    ("10.0f", "10.0", "10.0f"),
    ("10.0f", "10.0a", "10.0f"),
    ("10.3f", "10.0", ""),
    ("12.0f", "12.1", "12.0f"),
    ("10.0;10.0f", "10.0", "10.0"),
    # Plain archs: highest same-major arch not above the requested one.
    ("8.0", "8.6", "8.0"),
    ("8.0", "7.5", ""),
    ("7.5;8.0", "9.0", ""),
    ("7.5;8.0;8.6;8.9;9.0;10.0;12.0", "12.1", "12.0"),
    ("12.0;12.1", "12.1", "12.1"),
    ("10.0;10.1;10.3", "10.3", "10.3"),
    ("10.0;10.1", "10.3", "10.1"),
    ("9.0", "8.9;10.0;12.0", ""),
    ("", "8.0", ""),
    ("8.0", "", ""),
    # Jetson-only archs (7.2 8.7 11.0) serve only exactly themselves.
    ("8.0;8.6;8.7;9.0", "8.9", "8.6"),
    ("8.0;8.6;8.7;9.0", "8.7", "8.7"),
    ("8.7", "8.9", ""),
    ("7.0;7.2", "7.5", "7.0"),
    ("7.0;7.5", "7.2", "7.0"),
    ("11.0", "11.0", "11.0"),
    ("10.0;12.0", "11.0", ""),
    # +PTX on the request: same major first, else lower-major plain PTX.
    ("9.0", "9.0+PTX", "9.0+PTX"),
    ("7.5;8.0", "9.0+PTX", "8.0+PTX"),
    ("8.0;8.7", "9.0+PTX", "8.0+PTX"),
    ("8.0;9.0", "12.0+PTX", "9.0+PTX"),
    ("8.0;8.6;8.7;9.0", "8.9;8.7;9.0a;12.0+PTX", "8.6;8.7;9.0+PTX;9.0a"),
    # +PTX on the supported arch: it may serve later majors.
    ("8.0+PTX", "12.0", "8.0+PTX"),
    ("8.0+PTX", "8.6", "8.0"),
    ("8.0+PTX", "8.0;12.0", "8.0+PTX"),
    ("8.0+PTX;9.0", "12.0", "8.0+PTX"),
    ("8.9+PTX;9.0", "9.0;10.0", "8.9+PTX;9.0"),
    ("10.0+PTX", "11.0", "10.0+PTX"),
    ("9.0a+PTX", "10.0", ""),  # arch-specific PTX does not cross majors
    ("10.0f+PTX", "12.0", ""),  # nor does family PTX
    # Dedup and X.Y / X.Y+PTX merging.
    ("8.0;8.6", "8.6;8.9", "8.6"),
    ("8.0;8.6", "8.6;8.9+PTX", "8.6+PTX"),
    ("8.0", "8.0;8.6;8.9", "8.0"),
    # Order independence (shuffled lists, same answer).
    ("12.0;9.0;7.5;10.0;8.6;8.0;8.9", "12.1;8.6;7.5", "7.5;8.6;12.0"),
    ("7.5;8.0;8.6;8.9;9.0;10.0;12.0", "7.5;8.6;12.1", "7.5;8.6;12.0"),
    (
        "7.5;8.0;8.6;8.9;9.0;10.0;12.0",
        "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
        "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
    ),
]

# (arch string, normalised result) for aphrodite_parse_cuda_archs.
PARSE_CASES = [
    ("9.0 8.0;9.0+ptx", "8.0;9.0+PTX"),
    ("12.0a 10.0f 7.5", "7.5;10.0f;12.0a"),
    ("  8.6 ;; 8.6 ", "8.6"),
    ("8.0+PTX 8.0", "8.0+PTX"),
    ("9.0a 9.0 9.0a+PtX", "9.0;9.0a+PTX"),
    ("12.1;10.3;10.0;9.0;8.9;8.6;8.0;7.5", "7.5;8.0;8.6;8.9;9.0;10.0;10.3;12.1"),
    ("11.0f 10.1a 8.7 7.2 5.0", "5.0;7.2;8.7;10.1a;11.0f"),
]

# (arch string, nvcc version or None, substrings the error must contain).
PARSE_ERROR_CASES = [
    ("9.1", None, ["'9.1'", "not a CUDA arch", "8.6 8.7 8.9 9.0 10.0"]),
    ("8.0 sm_90", None, ["'sm_90'", "write '9.0'"]),
    ("compute_90", None, ["'compute_90'", "write '9.0'"]),
    ("sm_100a", None, ["'sm_100a'", "write '10.0a'"]),
    ("8.0+ptx+ptx", None, ["'8.0+ptx+ptx'", "'8.0+PTX'"]),
    ("8.0a", None, ["'8.0a'", "no `a` variant", "'8.0'"]),
    ("9.0f", None, ["'9.0f'", "no `f` variant"]),
    ("12.1(2.0)", None, ["'12.1(2.0)'", "write just '12.1'"]),
    ("", None, ["empty"]),
    (" ; ", None, ["empty"]),
    ("9", None, ["'9'", "MAJOR.MINOR"]),
    ("9.0A", None, ["'9.0A'", "lower case"]),
    ("8.0,9.0", None, ["'8.0,9.0'", "MAJOR.MINOR"]),
    ("7.0 9.0", "13.0", ["nvcc 13.0", "7.0", "can build: 7.5 8.0"]),
    ("10.0f", "12.8", ["nvcc 12.8", "10.0f"]),
    ("11.0", "12.8", ["nvcc 12.8", "11.0"]),
    ("10.1", "13.0", ["nvcc 13.0", "10.1"]),
    ("9.0a", "11.8", ["nvcc 11.8", "9.0a"]),
]

# (normalised archs, nvcc version) that must pass the toolkit check.
TOOLKIT_OK_CASES = [
    ("7.0;8.0", "12.8"),
    ("10.0f;12.1a", "12.9"),
    ("7.5;11.0f", "13.0"),
    ("8.0;9.0", "11.8.89"),
]

# (archs, expected flags) for aphrodite_cuda_gencode_flags.
GENCODE_CASES = [
    ("8.0", "-gencode=arch=compute_80,code=sm_80"),
    ("9.0a", "-gencode=arch=compute_90a,code=sm_90a"),
    ("10.0", "-gencode=arch=compute_100,code=sm_100"),
    (
        "12.0+PTX",
        "-gencode=arch=compute_120,code=sm_120;-gencode=arch=compute_120,code=compute_120",
    ),
    (
        "10.0f+PTX",
        "-gencode=arch=compute_100f,code=sm_100f;-gencode=arch=compute_100f,code=compute_100f",
    ),
    (
        "7.5;8.6",
        "-gencode=arch=compute_75,code=sm_75;-gencode=arch=compute_86,code=sm_86",
    ),
    ("", ""),
]

_FULL_DEFAULT = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
# (nvcc version, expected default arch list).
DEFAULT_CASES = [
    ("10.2", "7.5+PTX"),
    ("11.0", "7.5;8.0+PTX"),
    ("11.1", "7.5;8.0;8.6+PTX"),
    ("11.8", "7.5;8.0;8.6;8.9;9.0+PTX"),
    ("12.4", "7.5;8.0;8.6;8.9;9.0+PTX"),
    ("12.8", _FULL_DEFAULT),
    ("12.9", _FULL_DEFAULT),
    ("13.0", _FULL_DEFAULT),
]

# (nvcc version, expected plain archs it can build).
TOOLKIT_ARCHS_CASES = [
    ("11.8", "5.0;5.2;5.3;6.0;6.1;6.2;7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0"),
    (
        "12.8",
        "5.0;5.2;5.3;6.0;6.1;6.2;7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;12.0",
    ),
    ("13.0", "7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.3;11.0;12.0;12.1"),
]

HIP_PARSE_CASES = [
    ("gfx942 gfx90a;gfx942", "gfx90a;gfx942"),
    ("gfx1201;gfx1100 gfx906", "gfx906;gfx1100;gfx1201"),
]

HIP_PARSE_ERROR_CASES = [
    ("gfx942 gfx943", ["'gfx943'", "gfx942 gfx950"]),
    ("gfx90a:xnack+", ["'gfx90a:xnack+'", "'gfx90a'"]),
    ("GFX942", ["'GFX942'", "'gfx942'"]),
    ("", ["empty"]),
]

HIP_INTERSECT_CASES = [
    ("gfx90a;gfx942;gfx1100", "gfx1100;gfx942;gfx1201", "gfx942;gfx1100"),
    ("gfx942", "gfx950", ""),
    ("gfx1201;gfx950;gfx942", "gfx942;gfx950;gfx1201", "gfx942;gfx950;gfx1201"),
]

HIP_FLAGS_CASES = [
    ("gfx942", "--offload-arch=gfx942"),
    ("gfx90a;gfx1100", "--offload-arch=gfx90a;--offload-arch=gfx1100"),
]

# ---------------------------------------------------------------------------

DRIVER = Path(__file__).resolve().parent / "archs_driver.cmake"
MIN_CMAKE = (3, 26)


def _find_cmake():
    cmake = shutil.which("cmake")
    if cmake is None:
        return None, "cmake not found on PATH"
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True)
    m = re.search(r"cmake version (\d+)\.(\d+)", out.stdout)
    if not m:
        return None, f"cannot read the version of {cmake}"
    if (int(m.group(1)), int(m.group(2))) < MIN_CMAKE:
        return None, f"{cmake} is {m.group(0)}, need >= 3.26"
    return cmake, ""


CMAKE, _SKIP_REASON = _find_cmake()
pytestmark = pytest.mark.skipif(CMAKE is None, reason=_SKIP_REASON)


def _run(op, defines):
    args = [CMAKE, f"-DOP={op}"]
    args += [f"-D{k}={v}" for k, v in defines.items()]
    args += ["-P", str(DRIVER)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _run_batch(op, cases):
    """cases: list of dicts of driver inputs; returns the list of results."""
    defines = {"N": str(len(cases))}
    for i, case in enumerate(cases):
        for k, v in case.items():
            defines[f"{k}_{i}"] = v
    proc = _run(op, defines)
    assert proc.returncode == 0, proc.stderr
    results = dict(re.findall(r"^RESULT_(\d+)=(.*)$", proc.stderr, re.M))
    assert len(results) == len(cases), proc.stderr
    return [results[str(i)] for i in range(len(cases))]


def _run_error(op, defines):
    proc = _run(op, defines)
    assert proc.returncode != 0, f"expected an error, got: {proc.stderr}"
    # CMake wraps FATAL_ERROR text; compare with whitespace collapsed.
    return " ".join(proc.stderr.split())


def _error_defines(op, arch_string, nvcc=None):
    defines = {"ARCHS": arch_string}
    if nvcc:
        defines["TOOLKIT"] = nvcc
    return op, defines


# Every error case needs its own cmake process; start them all at once, in
# parallel, the first time any error test asks (cmake start-up dominates).
_ERROR_JOBS = [_error_defines("parse", s, n) for s, n, _ in PARSE_ERROR_CASES] + [
    _error_defines("parse_hip", s) for s, _ in HIP_PARSE_ERROR_CASES
]


@functools.cache
def _error_messages():
    workers = min(len(_ERROR_JOBS), 8, max(2, os.cpu_count() or 2))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        procs = list(pool.map(lambda job: _run(*job), _ERROR_JOBS))
    return procs


def _error_message(op, arch_string, nvcc=None):
    proc = _error_messages()[_ERROR_JOBS.index(_error_defines(op, arch_string, nvcc))]
    assert proc.returncode != 0, f"expected an error, got: {proc.stderr}"
    return " ".join(proc.stderr.split())


def _shuffled(lst, seed):
    items = [x for x in lst.split(";") if x]
    random.Random(seed).shuffle(items)
    return ";".join(items)


@functools.cache
def _intersect_results():
    """All intersection cases, each also with shuffled inputs, in one run."""
    cases = []
    for i, (sup, req, _) in enumerate(INTERSECT_CASES):
        cases.append({"SUPPORTED": sup, "REQUESTED": req})
        for seed in (1, 2):
            cases.append(
                {
                    "SUPPORTED": _shuffled(sup, 100 * i + seed),
                    "REQUESTED": _shuffled(req, 100 * i + seed + 50),
                }
            )
    flat = _run_batch("intersect", cases)
    return [tuple(flat[3 * i : 3 * i + 3]) for i in range(len(INTERSECT_CASES))]


@functools.cache
def _batched(op, key, values):
    return _run_batch(op, [{key: v} for v in values])


def _ids(cases):
    return [" | ".join(str(x) for x in c[:2]) or "<empty>" for c in cases]


# ---------------------------------------------------------------------------
# CUDA intersection
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("idx", range(len(INTERSECT_CASES)), ids=_ids(INTERSECT_CASES))
def test_intersect(idx):
    sup, req, expected = INTERSECT_CASES[idx]
    got, *shuffled = _intersect_results()[idx]
    assert got == expected, f"SUPPORTED={sup} REQUESTED={req}"
    assert shuffled == [expected, expected], "result depends on input order"


def test_intersect_inputs_are_normalised():
    # The golden lists must hold only archs that aphrodite_parse_cuda_archs
    # accepts unchanged (the shuffled ones are allowed to be out of order).
    lists = sorted({x for c in INTERSECT_CASES for x in c if x})
    got = _batched("parse", "ARCHS", tuple(lists))
    for given, parsed in zip(lists, got, strict=True):
        assert sorted(parsed.split(";")) == sorted(given.split(";")), given


def test_intersect_rejects_unnormalised():
    msg = _run_error("intersect", {"SUPPORTED": "sm_80", "REQUESTED": "8.0"})
    assert "'sm_80'" in msg and "aphrodite_parse_cuda_archs" in msg


# ---------------------------------------------------------------------------
# CUDA parsing and toolkit checks
# ---------------------------------------------------------------------------


def test_parse():
    got = _batched("parse", "ARCHS", tuple(s for s, _ in PARSE_CASES))
    assert got == [expected for _, expected in PARSE_CASES]


@pytest.mark.parametrize(
    "arch_string,nvcc,needles",
    PARSE_ERROR_CASES,
    ids=[f"{s!r}@{n}" if n else repr(s) for s, n, _ in PARSE_ERROR_CASES],
)
def test_parse_errors(arch_string, nvcc, needles):
    msg = _error_message("parse", arch_string, nvcc)
    for needle in needles:
        assert needle in msg, msg


def test_toolkit_ok():
    cases = [{"ARCHS": a, "NVCC": v} for a, v in TOOLKIT_OK_CASES]
    assert _run_batch("check_toolkit", cases) == ["OK"] * len(cases)


def test_toolkit_archs():
    got = _batched("toolkit_archs", "NVCC", tuple(v for v, _ in TOOLKIT_ARCHS_CASES))
    assert got == [expected for _, expected in TOOLKIT_ARCHS_CASES]


def test_toolkit_bad_version():
    msg = _run_error("toolkit_archs", {"NVCC": "twelve"})
    assert "'twelve'" in msg


# ---------------------------------------------------------------------------
# CUDA flags and defaults
# ---------------------------------------------------------------------------


def test_gencode():
    got = _batched("gencode", "ARCHS", tuple(a for a, _ in GENCODE_CASES))
    assert got == [expected for _, expected in GENCODE_CASES]


def test_default_archs():
    got = _batched("default", "NVCC", tuple(v for v, _ in DEFAULT_CASES))
    assert got == [expected for _, expected in DEFAULT_CASES]


# ---------------------------------------------------------------------------
# HIP
# ---------------------------------------------------------------------------


def test_parse_hip():
    got = _batched("parse_hip", "ARCHS", tuple(s for s, _ in HIP_PARSE_CASES))
    assert got == [expected for _, expected in HIP_PARSE_CASES]


@pytest.mark.parametrize(
    "arch_string,needles",
    HIP_PARSE_ERROR_CASES,
    ids=[repr(s) for s, _ in HIP_PARSE_ERROR_CASES],
)
def test_parse_hip_errors(arch_string, needles):
    msg = _error_message("parse_hip", arch_string)
    for needle in needles:
        assert needle in msg, msg


def test_intersect_hip():
    cases = [{"SUPPORTED": s, "REQUESTED": r} for s, r, _ in HIP_INTERSECT_CASES]
    got = _run_batch("intersect_hip", cases)
    assert got == [expected for _, _, expected in HIP_INTERSECT_CASES]


def test_hip_flags():
    got = _batched("hip_flags", "ARCHS", tuple(a for a, _ in HIP_FLAGS_CASES))
    assert got == [expected for _, expected in HIP_FLAGS_CASES]
