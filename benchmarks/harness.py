"""The one benchmark harness: times callables on the GPU (CUDA events, median of many
repetitions after warm-up) or the CPU (wall clock, median), and writes results as markdown and
JSON under benchmarks/results/ with the device, date and commit."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


_FLUSH: list[torch.Tensor] = []


def _flush_buffer() -> torch.Tensor:
    if not _FLUSH:
        _FLUSH.append(torch.zeros(256 * 2**20, dtype=torch.float32, device="cuda"))
    return _FLUSH[0]


def median_ms(fn, device: str, warmup: int = 10, reps: int = 100) -> float:
    for _ in range(warmup):
        fn()
    if device == "cuda":
        # Before each timed call the GPU reads 1 GiB (about 0.35 ms on an H100: longer than the
        # call's host-side work takes to launch it, torch.compile's guards included, and far
        # more than the L2 of the GPUs we measure on): the events then time the kernels alone,
        # not the host's launch latency, from a cold L2. Read, not written: a flush that writes
        # (zero_) leaves the L2 full of dirty lines, whose write-back the timed call then pays
        # for, the same few microseconds for every contender, which flattens the ratios of
        # short calls; after a read the L2 holds clean lines of the flush buffer, as it holds
        # clean weights between the layers of a model being served.
        flush = _flush_buffer()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.amax()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_ms(fn, calls: int = 50, reps: int = 40, after=None) -> float | None:
    """Per-call device time, ms, of `calls` back-to-back calls of `fn` replayed from one CUDA
    graph (median over `reps` replays); None where `fn` cannot be captured (a host sync), with
    the reason printed. With `after` (a callable), each call of `fn` follows one of `after` in
    the graph and the figure is what the pair takes over `after` alone: `fn`'s time where the
    kernel before it is someone else's (ours, launched with programmatic dependent launch on
    sm_90, start while the kernel before them ends; that overlap is largest after one of ours).

    What a decode step served from a CUDA graph sees: no host launch latency, no events around
    each call (whose overhead and ~0.5 us resolution are most of median_ms's figure for a call
    of a few microseconds), and the inputs warm in the L2 after the first call, as the previous
    op's output would be. The GPU waits (torch.cuda._sleep) before the start event while the
    host submits the replay, so the graph's own launch is not timed either. Compare figures
    within one run: between runs, and for some rows between allocations of the inputs, they
    moved by up to 0.2 us."""
    if after is not None:
        pair = graph_ms(lambda: (after(), fn()), calls, reps)
        alone = graph_ms(after, calls, reps)
        return None if pair is None or alone is None else pair - alone
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            fn()
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError as error:
        torch.cuda.set_stream(stream)  # a failed capture's exit leaves its own stream current
        torch.cuda.synchronize()
        print(f"graph_ms: not captured: {str(error).splitlines()[0]}", flush=True)
        return None
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)  # ~50 us: longer than the host takes to submit the replay
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def generator_choices(name: str) -> dict[str, list[str]]:
    """The values each option of codegen/<name>.py accepts, from its --describe (e.g. marlin's
    block shapes)."""
    generator = RESULTS.parent.parent / "codegen" / f"{name}.py"
    cmd = [sys.executable, str(generator), "--out-dir", "unused", "--archs", "9.0a", "--describe"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"codegen/{name}.py --describe failed:\n{proc.stderr}")
    return json.loads(proc.stdout)["choices"]


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def commit() -> str:
    """HEAD's short hash, or APHRODITE_COMMIT where the tree travelled without .git."""
    if os.environ.get("APHRODITE_COMMIT"):
        return os.environ["APHRODITE_COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=RESULTS.parent,
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        return "unknown"


def write(
    name: str,
    device: str,
    header: list[str],
    rows: list[list],
    out_dir: Path | None = None,
    notes: str = "",
    tag: str | None = None,
) -> str:
    """Writes results/<name>_<tag or device>.md and .json; returns the markdown."""
    meta = {
        "device": device_name(device),
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "torch": torch.__version__,
    }
    lines = [
        f"# {name}",
        "",
        f"device: {meta['device']}; date: {meta['date']}; "
        f"commit: {meta['commit']}; torch {meta['torch']}",
        "",
    ]
    if notes:
        lines += [notes, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    for directory in filter(None, [RESULTS, out_dir]):
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"{name}_{tag or device}"
        (directory / f"{stem}.md").write_text(text)
        (directory / f"{stem}.json").write_text(
            json.dumps({**meta, "header": header, "rows": rows}, indent=1)
        )
    return text
