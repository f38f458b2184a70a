# CUTLASS / CuTe headers for the families that build on them (flash attention, CUTLASS GEMMs).
#
# Offers:
#   aphrodite::cute (INTERFACE target)
#       Exists when the headers were found; carries their include dir. Families that need it
#       say `NEEDS cute` in aphrodite_add_family(), which links it into their module.
#   APHRODITE_CUTLASS_SRC_DIR (cache)
#       A CUTLASS checkout (a directory holding include/cute); takes precedence.
#   APHRODITE_CUTLASS_FETCH (cache, OFF)
#       Lets the build clone CUTLASS ${APHRODITE_CUTLASS_TAG} with FetchContent when neither the
#       directory nor the nvidia-cutlass package is there. Off by default: builds are usually
#       offline, and a silent clone would make a build depend on the network.
#   APHRODITE_CUTLASS_INCLUDE_DIR, APHRODITE_CUTLASS_ORIGIN
#       What was found and where from.
#   APHRODITE_CUTE_MISSING_REASON
#       When nothing was found: the sentence a `NEEDS cute` family records in the plan, naming
#       the three ways to provide the headers.
#
# Lookup order: APHRODITE_CUTLASS_SRC_DIR, the nvidia-cutlass Python package of the build's
# Python3_EXECUTABLE (its headers ship under cutlass_library/source/include, so this works
# offline), FetchContent when opted in.

set(APHRODITE_CUTLASS_SRC_DIR "" CACHE PATH "CUTLASS source dir (holding include/cute)")
option(APHRODITE_CUTLASS_FETCH "Clone CUTLASS with FetchContent when not found locally" OFF)
# Matches the nvidia-cutlass wheel the project tests with (4.2.0.0).
set(APHRODITE_CUTLASS_TAG "v4.2.0" CACHE STRING "CUTLASS tag for APHRODITE_CUTLASS_FETCH")

string(CONCAT APHRODITE_CUTLASS_HOW_TO "install the nvidia-cutlass package into the build's Python "
  "(pip install nvidia-cutlass), or set APHRODITE_CUTLASS_SRC_DIR to a CUTLASS checkout, or "
  "configure with APHRODITE_CUTLASS_FETCH=ON to clone CUTLASS ${APHRODITE_CUTLASS_TAG}")

function(_aphrodite_find_cutlass)
  set(_include "")
  set(_origin "")
  if(APHRODITE_CUTLASS_SRC_DIR)
    if(NOT EXISTS "${APHRODITE_CUTLASS_SRC_DIR}/include/cute/tensor.hpp")
      message(FATAL_ERROR "APHRODITE_CUTLASS_SRC_DIR='${APHRODITE_CUTLASS_SRC_DIR}' has no "
        "include/cute/tensor.hpp: point it at a CUTLASS checkout (the directory holding "
        "include/)")
    endif()
    set(_include "${APHRODITE_CUTLASS_SRC_DIR}/include")
    set(_origin "APHRODITE_CUTLASS_SRC_DIR")
  endif()
  if(NOT _include)
    # Imported without running its __init__ side effects beyond locating the package.
    execute_process(COMMAND "${Python3_EXECUTABLE}" -c
      "import importlib.util as u, os; s = u.find_spec('cutlass_library'); \
print(os.path.join(os.path.dirname(s.origin), 'source', 'include') if s else '')"
      OUTPUT_VARIABLE _pkg OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND _pkg AND EXISTS "${_pkg}/cute/tensor.hpp")
      set(_include "${_pkg}")
      set(_origin "the nvidia-cutlass package")
    endif()
  endif()
  if(NOT _include AND APHRODITE_CUTLASS_FETCH)
    include(FetchContent)
    # SOURCE_SUBDIR names a directory without a CMakeLists.txt: headers only, CUTLASS's own
    # project (tests, profiler) is never configured.
    FetchContent_Declare(aphrodite_cutlass
      GIT_REPOSITORY https://github.com/NVIDIA/cutlass.git
      GIT_TAG ${APHRODITE_CUTLASS_TAG}
      GIT_SHALLOW TRUE
      SOURCE_SUBDIR aphrodite-headers-only)
    FetchContent_MakeAvailable(aphrodite_cutlass)
    if(EXISTS "${aphrodite_cutlass_SOURCE_DIR}/include/cute/tensor.hpp")
      set(_include "${aphrodite_cutlass_SOURCE_DIR}/include")
      set(_origin "FetchContent of CUTLASS ${APHRODITE_CUTLASS_TAG}")
    endif()
  endif()

  if(_include)
    add_library(aphrodite_cute INTERFACE)
    add_library(aphrodite::cute ALIAS aphrodite_cute)
    # SYSTEM: CUTLASS's own warnings are not ours to fix.
    target_include_directories(aphrodite_cute SYSTEM INTERFACE "${_include}")
    message(STATUS "aphrodite_ext: CUTLASS/CuTe from ${_origin}: ${_include}")
  else()
    set(_origin "")
    set(APHRODITE_CUTE_MISSING_REASON
      "no CUTLASS/CuTe headers were found: ${APHRODITE_CUTLASS_HOW_TO}" PARENT_SCOPE)
  endif()
  set(APHRODITE_CUTLASS_INCLUDE_DIR "${_include}" PARENT_SCOPE)
  set(APHRODITE_CUTLASS_ORIGIN "${_origin}" PARENT_SCOPE)
endfunction()

# CuTe is CUDA-only; other backends never look (their CuTe families are skipped by their
# TARGET's backends or archs before NEEDS is consulted).
if(APHRODITE_DEVICE STREQUAL "cuda")
  _aphrodite_find_cutlass()
endif()
