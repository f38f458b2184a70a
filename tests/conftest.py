"""Shared fixtures: which devices the installed backend serves, and seeded randomness."""

from __future__ import annotations

import pytest
import torch


def kernel_devices() -> list[str]:
    """Devices the installed aphrodite_ext serves here: 'cpu' for the CPU backend, 'cuda' for
    a GPU backend where a GPU is visible. Empty when the package has not been built."""
    import aphrodite_ext

    info = aphrodite_ext.build_info()
    if not info:
        return []
    if info["backend"] == "cpu":
        return ["cpu"]
    return ["cuda"] if torch.cuda.is_available() else []


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        devices = kernel_devices()
        params = devices or [pytest.param("none", marks=pytest.mark.skip(
            reason="no device this aphrodite_ext build serves is here (not built, or a GPU "
                   "backend on a machine without a GPU)"))]
        metafunc.parametrize("device", params)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """A fresh seed per test, printed on failure, so that inputs differ run to run but a
    failure can be replayed with APHRODITE_TEST_SEED."""
    import os
    import random

    seed = int(os.environ.get("APHRODITE_TEST_SEED", random.randrange(2**31)))
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(f"seed: APHRODITE_TEST_SEED={seed}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.rep_call = report
        if report.failed:
            seeds = [v for k, v in item.user_properties if k == "seed"]
            if seeds:
                report.sections.append(("seed", f"APHRODITE_TEST_SEED={seeds[0]}"))
    return report
