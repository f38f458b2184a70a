# The build's knobs, validated before anything compiles, and the backend they select.
#
# Offers:
#   APHRODITE_TARGET_DEVICE   cache: auto | cuda | rocm | cpu (resolved to one of the last three)
#   APHRODITE_TORCH_*         facts about the torch in use (version, CUDA/HIP version, CXX std)
#   APHRODITE_CORE_CUDA_ARCHS / APHRODITE_CORE_HIP_ARCHS  archs the core families support
#   aphrodite_setup_backend()  finds torch and includes cmake/backend_<device>.cmake
#
# The same checks run in setup.py (aphrodite_ext/build_options.py) so that pip fails early;
# they are repeated here because CMake may also be run directly.

set(_APHRODITE_DEVICES auto cuda rocm cpu)
set(APHRODITE_TARGET_DEVICE "auto" CACHE STRING "Backend to build: ${_APHRODITE_DEVICES}")
set_property(CACHE APHRODITE_TARGET_DEVICE PROPERTY STRINGS ${_APHRODITE_DEVICES})
if(NOT APHRODITE_TARGET_DEVICE IN_LIST _APHRODITE_DEVICES)
  list(JOIN _APHRODITE_DEVICES ", " _valid)
  message(FATAL_ERROR "APHRODITE_TARGET_DEVICE='${APHRODITE_TARGET_DEVICE}' is not a backend; "
    "use one of: ${_valid}")
endif()

set(_APHRODITE_BUILD_TYPES Release Debug RelWithDebInfo MinSizeRel)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type: ${_APHRODITE_BUILD_TYPES}" FORCE)
elseif(NOT CMAKE_BUILD_TYPE IN_LIST _APHRODITE_BUILD_TYPES)
  list(JOIN _APHRODITE_BUILD_TYPES ", " _valid)
  message(FATAL_ERROR "CMAKE_BUILD_TYPE='${CMAKE_BUILD_TYPE}' is not a build type; "
    "use one of: ${_valid}")
endif()

set(APHRODITE_NVCC_THREADS "1" CACHE STRING "Threads each nvcc invocation may use (--threads)")
if(NOT APHRODITE_NVCC_THREADS MATCHES "^[1-9][0-9]*$")
  message(FATAL_ERROR "NVCC_THREADS='${APHRODITE_NVCC_THREADS}' must be a positive integer")
endif()
set(APHRODITE_VERSION "0.0.0" CACHE STRING "Package version recorded in the build info")

# Archs the core families (activation, norm, rope, cache, attention, quant) support; a
# family narrows them in its declaration. Jetson archs are in the list but only chosen when
# asked for by name (see archs.cmake).
set(APHRODITE_CORE_CUDA_ARCHS 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1)
set(APHRODITE_CORE_HIP_ARCHS
  gfx906 gfx908 gfx90a gfx942 gfx950 gfx1030 gfx1100 gfx1101 gfx1200 gfx1201)

find_package(Python3 REQUIRED COMPONENTS Interpreter Development.SABIModule)

# One look at the torch in use: its version, what it was built for, where its CMake files are.
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c [=[
import json, torch, torch.utils
cap = None
if torch.cuda.is_available():
    cap = "%d.%d" % torch.cuda.get_device_capability()
print(json.dumps({"version": torch.__version__.split("+")[0], "full": torch.__version__,
  "cuda": torch.version.cuda or "", "hip": torch.version.hip or "",
  "prefix": torch.utils.cmake_prefix_path, "gpu": torch.cuda.is_available(),
  "capability": cap or ""}))
]=]
  OUTPUT_VARIABLE _torch_json ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "aphrodite_ext builds against torch, but '${Python3_EXECUTABLE}' cannot "
    "import it: install torch into that Python first (pip install torch).\n${_torch_err}")
endif()
foreach(_key version full cuda hip prefix gpu capability)
  string(TOUPPER "${_key}" _up)
  string(JSON APHRODITE_TORCH_${_up} GET "${_torch_json}" ${_key})
endforeach()

# auto: a visible GPU and a torch built for its vendor pick that backend; otherwise cpu.
if(APHRODITE_TARGET_DEVICE STREQUAL "auto")
  if(APHRODITE_TORCH_GPU AND APHRODITE_TORCH_HIP)
    set(_device rocm)
    set(_why "a ROCm GPU is visible and torch ${APHRODITE_TORCH_FULL} is built for ROCm")
  elseif(APHRODITE_TORCH_GPU AND APHRODITE_TORCH_CUDA)
    set(_device cuda)
    set(_why "a CUDA GPU is visible and torch ${APHRODITE_TORCH_FULL} is built for CUDA")
  else()
    set(_device cpu)
    set(_why "no GPU is visible to torch ${APHRODITE_TORCH_FULL}")
  endif()
  message(STATUS "APHRODITE_TARGET_DEVICE=auto chose ${_device}: ${_why}")
  set(APHRODITE_DEVICE ${_device})
else()
  set(APHRODITE_DEVICE ${APHRODITE_TARGET_DEVICE})
endif()

if(APHRODITE_DEVICE STREQUAL "cuda" AND NOT APHRODITE_TORCH_CUDA)
  message(FATAL_ERROR "APHRODITE_TARGET_DEVICE=cuda needs a CUDA build of torch, but "
    "torch ${APHRODITE_TORCH_FULL} has no CUDA support: install a CUDA build of torch "
    "(e.g. pip install torch --index-url https://download.pytorch.org/whl/cu130) or build "
    "with APHRODITE_TARGET_DEVICE=cpu")
endif()
if(APHRODITE_DEVICE STREQUAL "rocm" AND NOT APHRODITE_TORCH_HIP)
  message(FATAL_ERROR "APHRODITE_TARGET_DEVICE=rocm needs a ROCm build of torch, but "
    "torch ${APHRODITE_TORCH_FULL} has no ROCm support: install a ROCm build of torch or "
    "build with APHRODITE_TARGET_DEVICE=cpu")
endif()

macro(aphrodite_setup_backend)
  # A build directory configured against another torch keeps that torch's Torch_DIR, and the
  # libraries its config found, in the cache: it would compile and link against them.
  if(DEFINED CACHE{Torch_DIR})
    string(FIND "${Torch_DIR}" "${APHRODITE_TORCH_PREFIX}" _torch_dir_at)
    if(NOT _torch_dir_at EQUAL 0)
      message(FATAL_ERROR "${CMAKE_BINARY_DIR} was configured against the torch at "
        "${Torch_DIR}; this Python's torch is at ${APHRODITE_TORCH_PREFIX}. Use another build "
        "directory (APHRODITE_BUILD_DIR) or delete this one (pip install -e . does so itself)")
    endif()
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${APHRODITE_TORCH_PREFIX}")
  include(backend_${APHRODITE_DEVICE})
  _aphrodite_backend_setup()
  # The C++ standard follows the torch in use (2.11 builds as C++17, 2.14's headers need C++20).
  get_target_property(APHRODITE_TORCH_CXX_STANDARD torch CXX_STANDARD)
  if(NOT APHRODITE_TORCH_CXX_STANDARD)
    set(APHRODITE_TORCH_CXX_STANDARD 17)
  endif()
endmacro()
