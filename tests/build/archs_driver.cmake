# Driver for tests/build/test_archs.py: runs one function of cmake/archs.cmake
# and prints its result, one line per case, to stderr:
#
#   RESULT=<;-separated list>          (single case)
#   RESULT_<i>=<;-separated list>      (batch of N cases, i = 0 .. N-1)
#
# Usage:
#   cmake -DOP=<op> [inputs] -P tests/build/archs_driver.cmake
#
#   OP              inputs (single case)          function
#   parse           ARCHS [TOOLKIT]               aphrodite_parse_cuda_archs
#   check_toolkit   ARCHS NVCC                    aphrodite_check_cuda_archs_for_toolkit
#   toolkit_archs   NVCC                          aphrodite_cuda_archs_for_toolkit
#   intersect       SUPPORTED REQUESTED           aphrodite_cuda_archs_intersect
#   gencode         ARCHS                         aphrodite_cuda_gencode_flags
#   default         NVCC                          aphrodite_default_cuda_archs
#   parse_hip       ARCHS                         aphrodite_parse_hip_archs
#   intersect_hip   SUPPORTED REQUESTED           aphrodite_hip_archs_intersect
#   hip_flags       ARCHS                         aphrodite_hip_offload_flags
#
# Batch form: -DN=<count> and the inputs suffixed with _<i>, e.g.
#   -DN=2 -DSUPPORTED_0=8.0 -DREQUESTED_0=8.6 -DSUPPORTED_1=9.0 -DREQUESTED_1=9.0a
# Errors stop the run with message(FATAL_ERROR) (non-zero exit), so error
# cases are run one per invocation.
cmake_minimum_required(VERSION 3.26)

include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/archs.cmake")

if(NOT DEFINED OP)
  message(FATAL_ERROR "archs_driver.cmake: pass -DOP=<op> (see the header).")
endif()

# Runs OP on the inputs whose names end in <sfx> ("" or "_<i>").
function(_driver_run_case sfx out_var)
  set(_archs "${ARCHS${sfx}}")
  set(_nvcc "${NVCC${sfx}}")
  set(_sup "${SUPPORTED${sfx}}")
  set(_req "${REQUESTED${sfx}}")
  if(OP STREQUAL "parse")
    if(DEFINED TOOLKIT${sfx})
      aphrodite_parse_cuda_archs(_r "${_archs}" TOOLKIT_VERSION "${TOOLKIT${sfx}}")
    else()
      aphrodite_parse_cuda_archs(_r "${_archs}")
    endif()
  elseif(OP STREQUAL "check_toolkit")
    aphrodite_check_cuda_archs_for_toolkit("${_archs}" "${_nvcc}")
    set(_r "OK")
  elseif(OP STREQUAL "toolkit_archs")
    aphrodite_cuda_archs_for_toolkit(_r "${_nvcc}")
  elseif(OP STREQUAL "intersect")
    aphrodite_cuda_archs_intersect(_r SUPPORTED "${_sup}" REQUESTED "${_req}")
  elseif(OP STREQUAL "gencode")
    aphrodite_cuda_gencode_flags(_r "${_archs}")
  elseif(OP STREQUAL "default")
    aphrodite_default_cuda_archs(_r "${_nvcc}")
  elseif(OP STREQUAL "parse_hip")
    aphrodite_parse_hip_archs(_r "${_archs}")
  elseif(OP STREQUAL "intersect_hip")
    aphrodite_hip_archs_intersect(_r SUPPORTED "${_sup}" REQUESTED "${_req}")
  elseif(OP STREQUAL "hip_flags")
    aphrodite_hip_offload_flags(_r "${_archs}")
  else()
    message(FATAL_ERROR "archs_driver.cmake: unknown OP '${OP}'.")
  endif()
  set(${out_var} "${_r}" PARENT_SCOPE)
endfunction()

if(DEFINED N)
  math(EXPR _last "${N} - 1")
  foreach(_i RANGE ${_last})
    _driver_run_case("_${_i}" _result)
    message(NOTICE "RESULT_${_i}=${_result}")
  endforeach()
else()
  _driver_run_case("" _result)
  message(NOTICE "RESULT=${_result}")
endif()
