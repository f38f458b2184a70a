"""The build's knobs in one typed place: environment variable -> value, with its documented
default and its checks. setup.py reads them before anything compiles; cmake/options.cmake
repeats the checks because CMake can be run directly.

Standard library only: setup.py loads this file without importing the package (and torch
only where a check needs it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DEVICES = ("auto", "cuda", "rocm", "cpu")
BUILD_TYPES = ("Release", "Debug", "RelWithDebInfo", "MinSizeRel")
ROOT = Path(__file__).resolve().parent.parent

# Peak memory of one compile job, measured on the 2-core CI machine: a binding .cpp with torch
# headers stays under 1.5 GiB, an nvcc job about 1.5 GiB per thread. MAX_JOBS keeps the sum
# of the jobs under the machine's memory, not just under its core count.
HOST_JOB_GIB = 1.5
NVCC_THREAD_GIB = 1.5


class BuildOptionError(ValueError):
    """A knob has a value the build cannot use; the message says which and what to do."""


def _available_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _positive_int(name: str, raw: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]*", raw.strip()):
        raise BuildOptionError(f"{name}={raw!r} must be a positive integer, e.g. {name}=4")
    return int(raw)


def default_max_jobs(
    nvcc_threads: int, cpus: int | None = None, mem_gib: float | None = None
) -> int:
    """Jobs that fit both the cores and the memory available now."""
    cpus = (
        cpus or len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1
    )
    mem_gib = _available_memory_gib() if mem_gib is None else mem_gib
    if mem_gib is None:
        return cpus
    per_job = max(HOST_JOB_GIB, NVCC_THREAD_GIB * nvcc_threads)
    return max(1, min(cpus, int(mem_gib // per_job)))


def find_nvcc() -> str | None:
    for candidate in (
        os.environ.get("CUDACXX"),
        os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        if os.environ.get("CUDA_HOME")
        else None,
        shutil.which("nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class TorchFacts:
    """What the torch in use was built for and what it sees."""

    version: str
    cuda: str | None
    hip: str | None
    gpu_visible: bool

    @classmethod
    def probe(cls) -> TorchFacts:
        try:
            import torch
        except ImportError as e:
            raise BuildOptionError(
                "aphrodite_ext builds against torch, which is not importable here: install "
                "torch first, then build with --no-build-isolation, or let pip's build "
                f"isolation install it ({e})"
            ) from e
        return cls(
            torch.__version__,
            torch.version.cuda,
            getattr(torch.version, "hip", None),
            torch.cuda.is_available(),
        )

    @property
    def local_suffix(self) -> str:
        if self.cuda:
            return "cu" + self.cuda.replace(".", "")[:3]
        if self.hip:
            return "rocm" + "".join(self.hip.split(".")[:2])
        return "cpu"


@dataclass
class BuildOptions:
    """Every knob of a build, read from the environment and checked."""

    device: str
    device_reason: str
    cuda_arch_list: str | None
    rocm_arch_list: str | None
    max_jobs: int
    nvcc_threads: int
    build_type: str
    cmake_args: list[str]
    build_dir: Path
    generator_options: str
    disable_families: list[str]
    compiler_launcher: str | None
    verbose: bool
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @classmethod
    def from_env(
        cls, env: dict[str, str] | None = None, torch_facts: TorchFacts | None = None
    ) -> BuildOptions:
        env = dict(os.environ if env is None else env)
        requested = env.get("APHRODITE_TARGET_DEVICE", "auto").strip().lower() or "auto"
        if requested not in DEVICES:
            raise BuildOptionError(
                f"APHRODITE_TARGET_DEVICE={env['APHRODITE_TARGET_DEVICE']!r} is not a backend; "
                f"use one of: {', '.join(DEVICES)}"
            )
        build_type = env.get("CMAKE_BUILD_TYPE", "").strip() or "Release"
        if build_type not in BUILD_TYPES:
            raise BuildOptionError(
                f"CMAKE_BUILD_TYPE={build_type!r} is not a build type; use one of: "
                f"{', '.join(BUILD_TYPES)}"
            )
        nvcc_threads = _positive_int("NVCC_THREADS", env.get("NVCC_THREADS", "").strip() or "1")
        max_jobs_env = env.get("MAX_JOBS", "").strip()
        try:
            cmake_args = shlex.split(env.get("CMAKE_ARGS", ""))
        except ValueError as e:
            raise BuildOptionError(f"CMAKE_ARGS={env['CMAKE_ARGS']!r} cannot be split: {e}") from e
        for name in cmake_defined_names(cmake_args):
            knob = ENV_KNOB_OF_CACHE_VARIABLE.get(name)
            if knob:
                raise BuildOptionError(
                    f"CMAKE_ARGS sets {name}; set the environment variable {knob} instead, so "
                    "that setup.py (backend, build directory, version) and CMake agree"
                )
        generator_options = env.get("APHRODITE_GENERATOR_OPTIONS", "")
        for entry in filter(None, generator_options.replace(";", " ").split()):
            if not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+=.+", entry):
                raise BuildOptionError(
                    f"APHRODITE_GENERATOR_OPTIONS entry {entry!r} is not <family>.<key>=<value>, "
                    "e.g. activation.dtypes=bf16"
                )

        # Families to leave out: passed on every configure (empty when unset), so that a
        # persistent build directory does not keep an earlier build's list in its CMake cache.
        # CMake checks the names against the declared families.
        disable_families = [
            f for f in re.split(r"[;,\s]+", env.get("APHRODITE_DISABLE_FAMILIES", "")) if f
        ]
        for family in disable_families:
            if not re.fullmatch(r"[a-z0-9_]+", family):
                raise BuildOptionError(
                    f"APHRODITE_DISABLE_FAMILIES entry {family!r} is not a family name "
                    "(e.g. APHRODITE_DISABLE_FAMILIES='flash_attn;marlin'; "
                    "`python -m aphrodite_ext plan` lists the families)"
                )

        torch_facts = torch_facts or TorchFacts.probe()
        cuda_arch_list = env.get("TORCH_CUDA_ARCH_LIST", "").strip() or None
        device, reason = resolve_device(requested, torch_facts, cuda_arch_list is not None)
        # nvcc's threads take memory only where nvcc runs.
        max_jobs = (
            _positive_int("MAX_JOBS", max_jobs_env)
            if max_jobs_env
            else default_max_jobs(nvcc_threads if device == "cuda" else 1)
        )
        if device == "cuda" and find_nvcc() is None:
            raise BuildOptionError(
                "APHRODITE_TARGET_DEVICE=cuda needs nvcc, and none was found in CUDACXX, "
                "CUDA_HOME/bin, PATH or /usr/local/cuda/bin: install the CUDA toolkit "
                f"(torch {torch_facts.version} wants CUDA {torch_facts.cuda}) or set CUDA_HOME"
            )
        if cuda_arch_list and device == "cuda":
            cuda_arch_list = check_cuda_arch_list(cuda_arch_list, nvcc_version(find_nvcc()))
        rocm_arch_list = env.get("PYTORCH_ROCM_ARCH") or None

        launcher = env.get("APHRODITE_COMPILER_LAUNCHER")
        if launcher is None:
            launcher = shutil.which("sccache") or shutil.which("ccache")
        build_dir_env = env.get("APHRODITE_BUILD_DIR", "")
        if build_dir_env and not build_dir_env.strip():
            raise BuildOptionError(
                f"APHRODITE_BUILD_DIR={build_dir_env!r} is blank; unset it for the default "
                f"build/{device}-{build_type.lower()} or name a directory"
            )
        build_dir = (
            Path(build_dir_env.strip()).expanduser()
            if build_dir_env
            else ROOT / "build" / f"{device}-{build_type.lower()}"
        )
        return cls(
            device=device,
            device_reason=reason,
            cuda_arch_list=cuda_arch_list,
            rocm_arch_list=rocm_arch_list,
            max_jobs=max_jobs,
            nvcc_threads=nvcc_threads,
            build_type=build_type,
            cmake_args=cmake_args,
            build_dir=build_dir.resolve(),
            generator_options=generator_options,
            disable_families=disable_families,
            compiler_launcher=launcher or None,
            verbose=env.get("VERBOSE", "") not in ("", "0"),
            env=env,
        )

    def cmake_configure_args(self, python: str, version: str) -> list[str]:
        args = [
            f"-DAPHRODITE_TARGET_DEVICE={self.device}",
            f"-DCMAKE_BUILD_TYPE={self.build_type}",
            f"-DPython3_EXECUTABLE={python}",
            f"-DAPHRODITE_NVCC_THREADS={self.nvcc_threads}",
            f"-DAPHRODITE_VERSION={version}",
            f"-DAPHRODITE_GENERATOR_OPTIONS={self.generator_options.replace(' ', ';')}",
            f"-DAPHRODITE_DISABLE_FAMILIES={';'.join(self.disable_families)}",
        ]
        if self.device == "cuda":
            nvcc = find_nvcc()
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
            args.append(f"-DCUDAToolkit_ROOT={Path(nvcc).resolve().parent.parent}")
            args.append(f"-DTORCH_CUDA_ARCH_LIST={self.cuda_arch_list or ''}")
        if self.device == "rocm":
            args.append(f"-DPYTORCH_ROCM_ARCH={self.rocm_arch_list or ''}")
        if self.compiler_launcher:
            for lang in ("C", "CXX", "CUDA", "HIP"):
                args.append(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={self.compiler_launcher}")
        return args + self.cmake_args


def resolve_device(
    requested: str, torch_facts: TorchFacts, cuda_archs_named: bool = False
) -> tuple[str, str]:
    """The backend to build and one line saying why. Under auto, TORCH_CUDA_ARCH_LIST with a
    CUDA build of torch asks for the CUDA backend (a build machine need not have a GPU)."""
    if requested == "cuda" and not torch_facts.cuda:
        raise BuildOptionError(
            f"APHRODITE_TARGET_DEVICE=cuda needs a CUDA build of torch, but torch "
            f"{torch_facts.version} has no CUDA support: install a CUDA build "
            "(pip install torch --index-url https://download.pytorch.org/whl/cu130) or build "
            "with APHRODITE_TARGET_DEVICE=cpu"
        )
    if requested == "rocm" and not torch_facts.hip:
        raise BuildOptionError(
            f"APHRODITE_TARGET_DEVICE=rocm needs a ROCm build of torch, but torch "
            f"{torch_facts.version} has no ROCm support: install a ROCm build or build with "
            "APHRODITE_TARGET_DEVICE=cpu"
        )
    if requested != "auto":
        return requested, "APHRODITE_TARGET_DEVICE=" + requested
    if torch_facts.gpu_visible and torch_facts.hip:
        return "rocm", f"auto: a ROCm GPU is visible and torch {torch_facts.version} supports it"
    if torch_facts.gpu_visible and torch_facts.cuda:
        return "cuda", f"auto: a CUDA GPU is visible and torch {torch_facts.version} supports it"
    if cuda_archs_named and torch_facts.cuda:
        return "cuda", (
            f"auto: TORCH_CUDA_ARCH_LIST names CUDA archs and torch {torch_facts.version} "
            "supports CUDA (no GPU needed to build)"
        )
    ignored = (
        "; TORCH_CUDA_ARCH_LIST is ignored: no CUDA build of torch" if cuda_archs_named else ""
    )
    if torch_facts.cuda or torch_facts.hip:
        return "cpu", f"auto: torch {torch_facts.version} sees no GPU{ignored}"
    return "cpu", f"auto: torch {torch_facts.version} is a CPU-only build{ignored}"


# CMake cache variables that an environment knob sets (setup.py passes them on every
# configure); CMAKE_ARGS setting one too would leave setup.py and CMake disagreeing.
ENV_KNOB_OF_CACHE_VARIABLE = {
    "APHRODITE_TARGET_DEVICE": "APHRODITE_TARGET_DEVICE",
    "CMAKE_BUILD_TYPE": "CMAKE_BUILD_TYPE",
    "TORCH_CUDA_ARCH_LIST": "TORCH_CUDA_ARCH_LIST",
    "PYTORCH_ROCM_ARCH": "PYTORCH_ROCM_ARCH",
    "APHRODITE_NVCC_THREADS": "NVCC_THREADS",
    "APHRODITE_GENERATOR_OPTIONS": "APHRODITE_GENERATOR_OPTIONS",
    "APHRODITE_DISABLE_FAMILIES": "APHRODITE_DISABLE_FAMILIES",
    "Python3_EXECUTABLE": "the Python that runs setup.py",
}


def cmake_defined_names(args: list[str]) -> list[str]:
    """The cache variables that CMake arguments define, in every spelling CMake takes:
    -DNAME=v, -DNAME:TYPE=v, and -D NAME=v (two arguments)."""
    names = []
    for i, arg in enumerate(args):
        if arg == "-D" and i + 1 < len(args):
            definition = args[i + 1]
        elif arg.startswith("-D") and arg != "-D":
            definition = arg[2:]
        else:
            continue
        names.append(definition.split("=", 1)[0].split(":", 1)[0].strip())
    return names


def stale_cache_reason(
    cache_text: str, device: str, python: str, source_dir: str | None = None
) -> str | None:
    """Why a build directory's CMakeCache.txt cannot serve this configure (another backend, or
    another Python and so maybe another torch, whose paths the cache keeps, or another source
    tree: a build directory copied or moved with its checkout would otherwise go on compiling
    the sources it was configured for), or None."""
    cached = {}
    for line in cache_text.splitlines():
        match = re.fullmatch(
            r"(APHRODITE_TARGET_DEVICE|Python3_EXECUTABLE|CMAKE_HOME_DIRECTORY):[A-Z]+=(.*)", line
        )
        if match:
            cached[match.group(1)] = match.group(2)
    if cached.get("APHRODITE_TARGET_DEVICE", device) != device:
        return f"was configured for the {cached['APHRODITE_TARGET_DEVICE']} backend"
    # Paths as given: two virtual environments' pythons resolve to one interpreter.
    old = cached.get("Python3_EXECUTABLE")
    if old and os.path.abspath(old) != os.path.abspath(python):
        return f"was configured with {old}"
    home = cached.get("CMAKE_HOME_DIRECTORY")
    if source_dir and home and os.path.realpath(home) != os.path.realpath(source_dir):
        return f"was configured for the sources in {home}"
    return None


def find_cmake() -> str:
    """A CMake new enough for the build (>= 3.26): the `cmake` package's, else PATH's."""
    candidates = []
    try:
        import cmake  # the PyPI package; a build requirement

        candidates.append(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))
    except ImportError:
        pass
    candidates.append(shutil.which("cmake"))
    seen = []
    for exe in filter(None, candidates):
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        match = re.search(r"version (\d+)\.(\d+)", out)
        if match and (int(match.group(1)), int(match.group(2))) >= (3, 26):
            return exe
        seen.append(f"{exe} ({out.splitlines()[0] if out else 'unusable'})")
    raise BuildOptionError(
        "the build needs CMake >= 3.26; found "
        + (", ".join(seen) or "none")
        + ": pip install 'cmake>=3.26'"
    )


def check_cuda_arch_list(arch_list: str, nvcc_version: str | None = None) -> str:
    """Validates TORCH_CUDA_ARCH_LIST with the CMake functions the build uses (one source of
    truth); returns the normalised list."""
    cmd = [find_cmake(), f"-DARCHS={arch_list}"]
    if nvcc_version:
        cmd.append(f"-DNVCC_VERSION={nvcc_version}")
    proc = subprocess.run(
        cmd + ["-P", str(ROOT / "cmake" / "check_archs.cmake")], capture_output=True, text=True
    )
    if proc.returncode != 0:
        lines = [
            ln.strip()
            for ln in proc.stderr.splitlines()
            if ln.strip()
            and not ln.startswith("CMake Error")
            and "Call Stack" not in ln
            and not re.search(r"\.cmake:\d+", ln)
        ]
        raise BuildOptionError("TORCH_CUDA_ARCH_LIST: " + " ".join(lines))
    return proc.stdout.strip()


def nvcc_version(nvcc: str) -> str | None:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None
