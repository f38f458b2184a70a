# cmake -DARCHS="<list>" [-DNVCC_VERSION=<v>] -P cmake/check_archs.cmake
# Validates an arch list with the functions the build uses and prints the normalised list on
# stdout; setup.py runs it so that a bad TORCH_CUDA_ARCH_LIST fails before anything compiles.
cmake_minimum_required(VERSION 3.26)
include("${CMAKE_CURRENT_LIST_DIR}/archs.cmake")
aphrodite_parse_cuda_archs(_archs "${ARCHS}")
if(NVCC_VERSION)
  aphrodite_check_cuda_archs_for_toolkit("${_archs}" "${NVCC_VERSION}")
endif()
list(JOIN _archs " " _text)
execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "${_text}")
