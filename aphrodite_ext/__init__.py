"""aphrodite_ext: LLM inference kernels as PyTorch extension modules.

Import a module to register its ops (``import aphrodite_ext._C``), then call them through
``torch.ops._C.<op>`` or the typed wrappers in :mod:`aphrodite_ext.ops`. Importing a module
first checks the recorded build info against the running torch and fails with a sentence that
says what to do when they disagree (the package itself imports under any torch, so that
``python -m aphrodite_ext info|plan`` can say what the install holds). A module this install
did not build raises an ImportError that names the reason.
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import sys
from functools import cache
from pathlib import Path

from .version import BASE_VERSION

_PACKAGE_DIR = Path(__file__).resolve().parent
_BUILD_INFO = _PACKAGE_DIR / "_build_info.json"

#: Every extension module the project declares (CMakeLists.txt), built here or not.
MODULES = ("_C", "_moe_C", "_fa2_C", "_rocm_C")


class BuildMismatchError(ImportError):
    """The installed modules were built for another torch or backend than the running one."""


@cache
def build_info() -> dict:
    """The build plan recorded at configure (backend, archs, modules, families, toolchain);
    empty when the package has not been built."""
    try:
        return json.loads(_BUILD_INFO.read_text())
    except FileNotFoundError:
        return {}


def _version() -> str:
    return build_info().get("version") or BASE_VERSION


__version__ = _version()


def check_build_info(
    info: dict | None = None,
    torch_version: str | None = None,
    torch_cuda: str | None = None,
    torch_hip: str | None = None,
) -> None:
    """Raises BuildMismatchError when the install cannot run under the torch in use."""
    info = build_info() if info is None else info
    if not info:
        return
    import torch

    torch_version = torch_version or torch.__version__
    torch_cuda = torch.version.cuda if torch_cuda is None else torch_cuda
    torch_hip = getattr(torch.version, "hip", None) if torch_hip is None else torch_hip
    built = info["torch"]["version"]
    running = torch_version.split("+")[0]
    if built.split(".")[:2] != running.split(".")[:2]:
        raise BuildMismatchError(
            f"aphrodite_ext was built against torch {built} but torch {running} is running; "
            "torch's C++ ABI changes between minor releases, so rebuild aphrodite_ext "
            "(pip install -e . --no-build-isolation) or install torch " + built
        )
    backend = info["backend"]
    if backend == "cuda" and not torch_cuda:
        raise BuildMismatchError(
            f"aphrodite_ext was built for CUDA but torch {torch_version} has no CUDA support; "
            "install a CUDA build of torch or rebuild with APHRODITE_TARGET_DEVICE=cpu"
        )
    built_cuda = str(info["torch"].get("cuda") or "")
    if backend == "cuda" and built_cuda and torch_cuda:
        if built_cuda.split(".")[0] != torch_cuda.split(".")[0]:
            raise BuildMismatchError(
                f"aphrodite_ext was built against torch {info['torch'].get('full', built)} "
                f"(CUDA {built_cuda}) but torch {torch_version} runs CUDA {torch_cuda}; the CUDA "
                "major version must match: rebuild aphrodite_ext (pip install -e . "
                f"--no-build-isolation) or install torch built for CUDA {built_cuda}"
            )
    if backend == "rocm" and not torch_hip:
        raise BuildMismatchError(
            f"aphrodite_ext was built for ROCm but torch {torch_version} has no ROCm support; "
            "install a ROCm build of torch or rebuild with APHRODITE_TARGET_DEVICE=cpu"
        )


# Knobs the extension modules read at run time, and the values each takes (the C++ side reads
# them without checking: a module is not loaded while one is set to anything else).
RUNTIME_KNOBS = {
    # Programmatic dependent launch on sm_90+ of every kernel but flash attention's
    # (kernels/common/launch.cuh): "0" launches them plainly.
    "APHRODITE_PDL": ("0", "1"),
}


def check_runtime_knobs() -> None:
    """Raises ValueError for a run-time knob set to a value it does not take."""
    for knob, values in RUNTIME_KNOBS.items():
        value = os.environ.get(knob)
        if value is not None and value not in values:
            raise ValueError(f"{knob}={value!r}: expected one of {', '.join(values)} (or unset)")


def module_status(name: str) -> tuple[bool, str]:
    """Whether extension module `name` is in this install, and if not, why."""
    info = build_info()
    if not info:
        return False, (
            "aphrodite_ext has not been built: run "
            "`pip install -e . --no-build-isolation` in the source tree"
        )
    module = info["modules"].get(name)
    if module is None:
        return False, f"{name} is not an aphrodite_ext module; modules: {', '.join(MODULES)}"
    if not module["built"]:
        return (
            False,
            f"{name} was not built for the {info['backend']} backend: it {module['reason']}",
        )
    return True, ""


def family_status(name: str) -> tuple[bool, str]:
    """Whether kernel family `name` is in this install (a narrowed build may leave it out), and
    if not, why."""
    info = build_info()
    if not info:
        return module_status("_C")
    family = info["families"].get(name)
    if family is None:
        return False, f"{name} is not a kernel family; families: {', '.join(info['families'])}"
    if not family["built"]:
        return False, f"the {name} family is not in this build: it {family['reason']}"
    return True, ""


def _extension_module(fullname: str) -> str | None:
    """The module name of `aphrodite_ext.<module>` for an extension module, else None."""
    package, _, name = fullname.rpartition(".")
    return name if package == __name__ and name in MODULES else None


class _BuildCheck(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: before `import aphrodite_ext.<module>` loads an extension module,
    checks the build info against the running torch (BuildMismatchError, before torch's C++ ABI
    can break in the loader), and refuses a module the recorded build skipped, even where a file
    of that name is left from an earlier build (another backend's). Finds nothing itself."""

    def find_spec(self, fullname, path=None, target=None):
        name = _extension_module(fullname)
        if name is None:
            return None
        check_runtime_knobs()
        check_build_info()
        built, why = module_status(name)
        if build_info() and not built:
            raise ImportError(f"aphrodite_ext.{name} is not available: {why}", name=fullname)
        return None


class _UnbuiltModuleFinder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: turns `import aphrodite_ext.<module>` of a module no finder found
    (no build at all) into an ImportError that says why, instead of a bare
    ModuleNotFoundError."""

    def find_spec(self, fullname, path=None, target=None):
        name = _extension_module(fullname)
        if name is None:
            return None
        raise ImportError(
            f"aphrodite_ext.{name} is not available: {module_status(name)[1]}", name=fullname
        )


def load(name: str):
    """Imports extension module `name` (registering its ops) and returns it."""
    return importlib.import_module(f"{__name__}.{name}")


sys.meta_path.insert(0, _BuildCheck())
sys.meta_path.append(_UnbuiltModuleFinder())
