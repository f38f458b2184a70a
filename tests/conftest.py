"""Shared fixtures: a fresh, replayable random seed per test."""

from __future__ import annotations

import pytest
import torch


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
