"""The build itself, measured: a clean configure + build, a rebuild with nothing changed (with
ninja's log as proof that nothing compiled and no generator ran), and a rebuild after touching
one kernel source (which translation units recompiled). Drives CMake directly in a fresh build
directory, so a developer's build/ is left alone.

    python benchmarks/bench_build.py --device cpu|cuda [--archs 9.0a] [--jobs N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The source touched for the one-file rebuild, per backend: a plain kernel source.
TOUCH = {"cuda": "kernels/layernorm/layernorm.cu", "cpu": "kernels/cpu/layernorm.cpp"}


def ninja_log_entries(build: Path) -> list[str]:
    """Outputs ninja has recorded as built, in order (one per command run)."""
    log = build / ".ninja_log"
    if not log.exists():
        return []
    return [ln.split("\t")[3] for ln in log.read_text().splitlines() if not ln.startswith("#")]


def timed(cmd: list[str], cwd: Path) -> float:
    """Seconds `cmd` took, with compiler caches off so that a clean build is one."""
    env = {**os.environ, "CCACHE_DISABLE": "1", "SCCACHE_DISABLE": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def kind(output: str) -> str:
    if output.endswith((".o", ".obj")):
        return "compile"
    if ".so" in output:
        return "link"
    if output.endswith((".cu", ".cpp", ".stamp")):
        return "generate"
    return "other"


def summarize(outputs: list[str]) -> str:
    counts: dict[str, int] = {}
    for o in outputs:
        counts[kind(o)] = counts.get(kind(o), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--archs", default="9.0a", help="TORCH_CUDA_ARCH_LIST for --device cuda")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    build = Path(tempfile.mkdtemp(prefix=f"aphrodite-bench-build-{args.device}-"))
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
        f"-DAPHRODITE_TARGET_DEVICE={args.device}", f"-DPython3_EXECUTABLE={sys.executable}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]  # fmt: skip
    if args.device == "cuda":
        configure.append(f"-DTORCH_CUDA_ARCH_LIST={args.archs}")
    ninja = ["ninja", "-C", str(build), f"-j{args.jobs}"]
    rows = []
    try:
        t_conf = timed(configure, ROOT)
        t_build = timed(ninja, ROOT)
        first = ninja_log_entries(build)
        rows.append(["clean configure", f"{t_conf:.1f} s", ""])
        rows.append(["clean build", f"{t_build:.1f} s", summarize(first)])

        t_conf = timed(["cmake", str(build)], ROOT)
        before = len(ninja_log_entries(build))
        t_noop = timed(ninja, ROOT)
        ran = ninja_log_entries(build)[before:]
        rows.append(["no-op re-configure", f"{t_conf:.2f} s", ""])
        rows.append(["no-op build", f"{t_noop:.2f} s", f"ninja ran: {summarize(ran)}"])
        assert not ran, f"a rebuild with nothing changed ran commands: {ran}"

        source = ROOT / TOUCH[args.device]
        os.utime(source)
        before = len(ninja_log_entries(build))
        t_touch = timed(ninja, ROOT)
        ran = ninja_log_entries(build)[before:]
        rows.append(
            [f"touch {TOUCH[args.device]}", f"{t_touch:.1f} s", f"ninja ran: {summarize(ran)}"]
        )
    finally:
        shutil.rmtree(build, ignore_errors=True)

    what = f"cuda-{args.archs.replace(' ', '_')}" if args.device == "cuda" else "cpu"
    notes = (
        f"backend {args.device}"
        + (f", archs {args.archs}" if args.device == "cuda" else "")
        + f"; ninja -j{args.jobs} on {os.cpu_count()} cores. A CPU kernel source compiles once"
        " per ISA (scalar, avx2, avx512), so touching one recompiles three objects."
    )
    header = ["step", "time", "what ran"]
    print(harness.write("build", "cpu", header, rows, args.out, notes, tag=what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
