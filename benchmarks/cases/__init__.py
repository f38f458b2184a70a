"""Benchmark cases, one module per kernel family, each named after it. A module defines
`cases(device, shape)` that yields `Case`s: our op against the function a user would run
instead (timed eager and under torch.compile). bench_kernels.py runs every module here."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """The sizes a family benchmarks at on a device: one large shape and decode sizes."""

    large_tokens: int
    hidden: int
    inter: int
    decode: tuple[int, ...]


SHAPES = {
    "cuda": Shape(large_tokens=8192, hidden=8192, inter=28672, decode=(1, 16, 64)),
    "cpu": Shape(large_tokens=4096, hidden=4096, inter=11008, decode=(1, 16)),
}


@dataclass(frozen=True)
class Case:
    op: str  # the row's name
    tokens: int
    width: int
    nbytes: int  # bytes each call must move at least (inputs read, outputs written once)
    ours: Callable[[], object]
    ref: Callable[[], object]  # plain torch; timed eager and compiled


def all_cases(device: str, families: list[str] | None = None) -> Iterator[Case]:
    """Cases of every family module here (or only of `families`), in name order."""
    shape = SHAPES[device]
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if families and info.name not in families:
            continue
        yield from importlib.import_module(f"{__name__}.{info.name}").cases(device, shape)
