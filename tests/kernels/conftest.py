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


@pytest.fixture
def far_view(device):
    """For the tests of the GPU kernels' 64-bit-index paths: make(shape, strides, dtype) returns
    a view of that shape and those element strides into a buffer just large enough (several GiB
    of storage, only the view's elements touched), so that its offsets pass 2^31. Skips off the
    GPU (the 32-/64-bit index choice is the GPU kernels') and on GPUs under 16 GiB."""
    if device != "cuda":
        pytest.skip("the 32-/64-bit index choice is the GPU kernels'")
    if torch.cuda.get_device_properties(0).total_memory < 16 << 30:
        pytest.skip("needs several GiB of GPU memory")

    def make(shape, strides, dtype=torch.bfloat16):
        size = 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))
        return torch.empty(size, dtype=dtype, device=device).as_strided(shape, strides)

    return make
