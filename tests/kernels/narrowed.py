"""What a kernel call says where a build narrowed by generator options (APHRODITE_GENERATOR_OPTIONS)
left out the instantiation it needs, and the skip a test makes of it. A default build never says
so: there the same call fails the test."""

from __future__ import annotations

import contextlib

import pytest

LEFT_OUT = (
    "(narrowed by APHRODITE_GENERATOR_OPTIONS",  # paged attention
    "was left out of this build",  # marlin: a (dtype, weight type, group mode)
    "this build does not hold",  # marlin: a block shape APHRODITE_MARLIN_CONFIG forces
    "is not in this build",  # flash attention
)


def left_out(error: BaseException) -> bool:
    """Whether `error` says that the build left out what the call needed."""
    return any(reason in str(error) for reason in LEFT_OUT)


@contextlib.contextmanager
def skip_left_out():
    """Skips the running test where the block raises what a narrowed build says of a left-out
    instantiation; anything else propagates."""
    try:
        yield
    except Exception as e:
        if not left_out(e):
            raise
        pytest.skip(str(e).splitlines()[0])
