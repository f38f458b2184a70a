"""Builds aphrodite_ext: reads and checks the build options (aphrodite_ext/build_options.py),
configures CMake once in a persistent build directory, builds, and installs each extension
module that the build plan says was built into the package."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MODULES = {
    "cpu": ["_C", "_moe_C"],
    "cuda": ["_C", "_moe_C", "_fa2_C"],
    "rocm": ["_C", "_moe_C", "_rocm_C"],
}


def _load_build_options():
    spec = importlib.util.spec_from_file_location(
        "_aphrodite_build_options", ROOT / "aphrodite_ext" / "build_options.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build_options = _load_build_options()
BASE_VERSION = re.search(
    r'BASE_VERSION = "([^"]+)"', (ROOT / "aphrodite_ext" / "version.py").read_text()
).group(1)
if importlib.util.find_spec("torch") is None:
    # pip asks for the build requirements before torch is installed in an isolated build;
    # the build proper runs this file again with torch present.
    OPTIONS, VERSION = None, BASE_VERSION
else:
    try:
        TORCH = build_options.TorchFacts.probe()
        OPTIONS = build_options.BuildOptions.from_env(torch_facts=TORCH)
    except build_options.BuildOptionError as e:
        sys.exit(f"aphrodite_ext: {e}")
    suffix = TORCH.local_suffix if OPTIONS.device != "cpu" else "cpu"
    VERSION = f"{BASE_VERSION}+{suffix}"


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[], py_limited_api=True)


class CMakeBuild(build_ext):
    """Configures once (again only when the options change), builds, installs the built
    modules and the build info into the package."""

    def run(self):
        print(
            f"aphrodite_ext: building the {OPTIONS.device} backend ({OPTIONS.device_reason}), "
            f"{OPTIONS.max_jobs} jobs, build dir {OPTIONS.build_dir}"
        )
        cmake = build_options.find_cmake()
        build_dir = OPTIONS.build_dir
        build_dir.mkdir(parents=True, exist_ok=True)
        args = OPTIONS.cmake_configure_args(sys.executable, VERSION)
        stamp = build_dir / "aphrodite_configure_args.json"
        cache = build_dir / "CMakeCache.txt"
        if cache.exists():
            why = build_options.stale_cache_reason(
                cache.read_text(errors="replace"), OPTIONS.device, sys.executable, str(ROOT)
            )
            if why:
                # Its cached compilers and torch paths would be used again: configure afresh.
                print(f"aphrodite_ext: {build_dir} {why}; configuring it afresh")
                cache.unlink()
                shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        if not cache.exists() or not stamp.exists() or json.loads(stamp.read_text()) != args:
            self._run([cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", *args])
            stamp.write_text(json.dumps(args))
        build = [cmake, "--build", str(build_dir), "-j", str(OPTIONS.max_jobs)]
        self._run(build + (["--verbose"] if OPTIONS.verbose else []))

        plan = json.loads((build_dir / "plan.json").read_text())
        built = [m for m, info in plan["modules"].items() if info["built"]]
        for name, info in plan["modules"].items():
            if not info["built"]:
                print(f"aphrodite_ext: module {name} not built: it {info['reason']}")
        self.extensions = [e for e in self.extensions if e.name.split(".")[-1] in built]
        prefix = (
            ROOT
            if (self.inplace or getattr(self, "editable_mode", False))
            else Path(self.build_lib)
        )
        for component in [*built, "build_info"]:
            self._run(
                [
                    cmake,
                    "--install",
                    str(build_dir),
                    "--component",
                    component,
                    "--prefix",
                    str(prefix),
                ]
            )

    def get_outputs(self):
        return [self.get_ext_fullpath(e.name) for e in self.extensions]

    @staticmethod
    def _run(cmd):
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


setup(
    version=VERSION,
    ext_modules=[CMakeExtension(f"aphrodite_ext.{m}") for m in MODULES[OPTIONS.device]]
    if OPTIONS
    else [],
    cmdclass={"build_ext": CMakeBuild},
    package_data={"aphrodite_ext": ["_build_info.json"]},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
