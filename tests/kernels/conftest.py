"""Kernel tests run on every device the installed backend serves here."""

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
        params = devices or [
            pytest.param(
                "none",
                marks=pytest.mark.skip(
                    reason="no device this aphrodite_ext build serves is here (not built, or a GPU "
                    "backend on a machine without a GPU)"
                ),
            )
        ]
        metafunc.parametrize("device", params)
