"""The build knobs: each bad value fails before anything compiles, with a message that says
what was expected (aphrodite_ext/build_options.py, which setup.py runs first)."""

import pytest
from conftest import build_options as bo

CPU_TORCH = bo.TorchFacts("2.13.0+cpu", None, None, False)
CUDA_TORCH_NO_GPU = bo.TorchFacts("2.14.1+cu130", "13.0", None, False)
CUDA_TORCH_GPU = bo.TorchFacts("2.14.1+cu130", "13.0", None, True)


def options(torch_facts=CPU_TORCH, **env):
    return bo.BuildOptions.from_env({k: str(v) for k, v in env.items()}, torch_facts)


def test_defaults_on_a_machine_without_gpu():
    opts = options()
    assert opts.device == "cpu" and "CPU-only" in opts.device_reason
    assert opts.build_type == "Release" and opts.max_jobs >= 1
    assert opts.build_dir.name == "cpu-release"


@pytest.mark.parametrize(
    "facts, device, why",
    [
        (CPU_TORCH, "cpu", "CPU-only build"),
        (CUDA_TORCH_NO_GPU, "cpu", "sees no GPU"),
        (CUDA_TORCH_GPU, "cuda", "CUDA GPU is visible"),
        (bo.TorchFacts("2.11.0+rocm6.3", None, "6.3.1", True), "rocm", "ROCm GPU is visible"),
    ],
)
def test_auto_picks_the_backend_and_says_why(facts, device, why):
    chosen, reason = bo.resolve_device("auto", facts)
    assert chosen == device and why in reason


@pytest.mark.parametrize(
    "env, match",
    [
        ({"APHRODITE_TARGET_DEVICE": "gpu"}, "not a backend; use one of: auto, cuda, rocm, cpu"),
        ({"APHRODITE_TARGET_DEVICE": "cuda"}, "needs a CUDA build of torch"),
        ({"APHRODITE_TARGET_DEVICE": "rocm"}, "needs a ROCm build of torch"),
        ({"MAX_JOBS": "0"}, "MAX_JOBS='0' must be a positive integer"),
        ({"MAX_JOBS": "four"}, "MAX_JOBS='four' must be a positive integer"),
        ({"NVCC_THREADS": "-2"}, "NVCC_THREADS='-2' must be a positive integer"),
        ({"CMAKE_BUILD_TYPE": "Fast"}, "not a build type"),
        ({"CMAKE_ARGS": "-DFOO='unterminated"}, "cannot be split"),
        ({"CMAKE_ARGS": "-DAPHRODITE_TARGET_DEVICE=cuda"}, "set the environment variable"),
        ({"APHRODITE_GENERATOR_OPTIONS": "dtypes=bf16"}, "<family>.<key>=<value>"),
        ({"APHRODITE_DISABLE_FAMILIES": "flash_attn;-DX=1"}, "'-DX=1' is not a family name"),
    ],
)
def test_bad_knobs_are_rejected(env, match):
    with pytest.raises(bo.BuildOptionError, match=match):
        options(**env)


@pytest.mark.parametrize(
    "value, families",
    [
        ("", ""),
        ("flash_attn", "flash_attn"),
        (" marlin, flash_attn;paged_attention ", "marlin;flash_attn;paged_attention"),
    ],
)
def test_disabled_families_reach_every_configure(value, families):
    # Passed on every configure, empty too: a persistent build directory's CMake cache must not
    # keep the list of an earlier build.
    args = options(APHRODITE_DISABLE_FAMILIES=value).cmake_configure_args("python3", "0")
    assert args.count(f"-DAPHRODITE_DISABLE_FAMILIES={families}") == 1


@pytest.mark.parametrize(
    "cmake_args, knob",
    [
        ("-DAPHRODITE_TARGET_DEVICE=cuda", "APHRODITE_TARGET_DEVICE"),
        ("-D APHRODITE_TARGET_DEVICE=cuda", "APHRODITE_TARGET_DEVICE"),
        ("-DAPHRODITE_TARGET_DEVICE:STRING=cuda", "APHRODITE_TARGET_DEVICE"),
        ("-G Ninja -DCMAKE_BUILD_TYPE=Debug", "CMAKE_BUILD_TYPE"),
        ("-DAPHRODITE_DISABLE_FAMILIES=marlin", "APHRODITE_DISABLE_FAMILIES"),
        ("-DAPHRODITE_GENERATOR_OPTIONS=marlin.dtypes=bf16", "APHRODITE_GENERATOR_OPTIONS"),
        ("-DAPHRODITE_NVCC_THREADS=4", "NVCC_THREADS"),
        ("-DTORCH_CUDA_ARCH_LIST=9.0a", "TORCH_CUDA_ARCH_LIST"),
    ],
)
def test_cmake_args_may_not_set_what_a_knob_sets(cmake_args, knob):
    # Either way of setting it, the two would disagree (setup.py names the build directory and
    # the version from the knobs): the environment variable is the one way.
    with pytest.raises(bo.BuildOptionError, match=f"set the environment variable {knob}"):
        options(CMAKE_ARGS=cmake_args)
    assert options(CMAKE_ARGS="-DAPHRODITE_CUTLASS_FETCH=ON -G Ninja").cmake_args


def test_auto_with_cuda_archs_and_a_cuda_torch_builds_cuda(monkeypatch):
    # A build machine need not have a GPU: naming archs asks for the CUDA backend.
    monkeypatch.setattr(bo, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(bo, "nvcc_version", lambda nvcc: "13.0")
    opts = options(CUDA_TORCH_NO_GPU, TORCH_CUDA_ARCH_LIST="9.0a")
    assert opts.device == "cuda" and "TORCH_CUDA_ARCH_LIST" in opts.device_reason
    opts = options(CPU_TORCH, TORCH_CUDA_ARCH_LIST="9.0a")
    assert opts.device == "cpu" and "TORCH_CUDA_ARCH_LIST is ignored" in opts.device_reason


def test_blank_knobs_mean_their_default_and_a_blank_build_dir_fails(tmp_path):
    opts = options(NVCC_THREADS=" ", CMAKE_BUILD_TYPE="", MAX_JOBS="")
    assert opts.nvcc_threads == 1 and opts.build_type == "Release" and opts.max_jobs >= 1
    with pytest.raises(bo.BuildOptionError, match="APHRODITE_BUILD_DIR=' ' is blank"):
        options(APHRODITE_BUILD_DIR=" ")
    assert options(APHRODITE_BUILD_DIR="~/bd").build_dir == (tmp_path / "x").home() / "bd"


def test_cuda_without_nvcc_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(bo, "find_nvcc", lambda: None)
    with pytest.raises(bo.BuildOptionError, match="needs nvcc.*install the CUDA toolkit"):
        options(CUDA_TORCH_NO_GPU, APHRODITE_TARGET_DEVICE="cuda")


@pytest.mark.parametrize(
    "arch_list, match",
    [
        ("9.1", "'9.1' is not a CUDA arch"),
        ("sm_90", "write '9.0'"),
        ("8.0+ptx+ptx", "repeats \\+PTX"),
        ("12.1(2.0)", "write just '12.1'"),
    ],
)
def test_bad_arch_lists_fail_before_configure(arch_list, match):
    with pytest.raises(bo.BuildOptionError, match=match):
        bo.check_cuda_arch_list(arch_list)


def test_arch_list_is_normalised_by_the_cmake_functions():
    assert bo.check_cuda_arch_list("9.0a;8.0 12.0+ptx") == "8.0 9.0a 12.0+PTX"


@pytest.mark.parametrize(
    "cpus, mem, threads, jobs",
    [
        (16, 128.0, 1, 16),  # plenty of memory: the cores decide
        (16, 12.0, 1, 8),  # 12 GiB / 1.5 GiB per job
        (16, 12.0, 4, 2),  # nvcc with 4 threads: 6 GiB per job
        (2, 0.5, 1, 1),  # never below one
    ],
)
def test_max_jobs_is_memory_aware(cpus, mem, threads, jobs):
    assert bo.default_max_jobs(threads, cpus=cpus, mem_gib=mem) == jobs


def test_local_version_suffix():
    assert CPU_TORCH.local_suffix == "cpu"
    assert CUDA_TORCH_GPU.local_suffix == "cu130"
    assert bo.TorchFacts("2.11.0", None, "6.3.42131", True).local_suffix == "rocm63"


def test_a_build_dir_of_another_backend_python_or_tree_is_configured_afresh(tmp_path):
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    copy.mkdir()
    cache = (
        "APHRODITE_TARGET_DEVICE:STRING=cuda\nPython3_EXECUTABLE:FILEPATH=/venv/bin/python\n"
        f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n"
    )
    assert "for the cuda backend" in bo.stale_cache_reason(cache, "cpu", "/venv/bin/python")
    assert "configured with /venv/bin/python" in bo.stale_cache_reason(
        cache, "cuda", "/other/bin/python"
    )
    # A checkout copied with its build dir: the cache still names the first tree's sources.
    assert f"for the sources in {src}" in bo.stale_cache_reason(
        cache, "cuda", "/venv/bin/python", str(copy)
    )
    (tmp_path / "link").symlink_to(src)
    for source_dir in (str(src), str(tmp_path / "link"), None):
        assert bo.stale_cache_reason(cache, "cuda", "/venv/bin/python", source_dir) is None
    assert bo.stale_cache_reason("", "cuda", "/venv/bin/python", str(copy)) is None
