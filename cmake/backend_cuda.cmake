# The CUDA backend: nvcc, torch's CUDA build, and per-source gencode flags from each family's
# arch intersection with the requested archs.
#
# Offers (called by families.cmake):
#   _aphrodite_backend_setup()                     nvcc + torch; parses the requested archs
#   _aphrodite_backend_family(<prefix> <name> ...) decides whether a family is built, for what
#   _aphrodite_backend_sources(<archs> <src>...)   sets each source's -gencode flags
#   _aphrodite_backend_link(<target>)              adds the kernel sources to a module

macro(_aphrodite_backend_setup)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "APHRODITE_TARGET_DEVICE=cuda needs nvcc, and none was found on PATH, "
      "in CUDA_HOME or in CUDACXX: install the CUDA toolkit (torch ${APHRODITE_TORCH_FULL} "
      "wants CUDA ${APHRODITE_TORCH_CUDA}) or set CUDACXX=/path/to/nvcc")
  endif()
  # Archs come from this file's flags only; CMake's own arch handling stays off.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)

  # torch's CMake reads TORCH_CUDA_ARCH_LIST with its own grammar, which lacks some of ours
  # (10.0f, 12.1): hide it while torch configures, then drop the global flags torch adds.
  set(_requested "${TORCH_CUDA_ARCH_LIST}")
  if(NOT _requested AND DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(_requested "$ENV{TORCH_CUDA_ARCH_LIST}")
  endif()
  # torch's CMake still looks the toolkit up through FindCUDA: point it at nvcc's toolkit.
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    set(CUDA_TOOLKIT_ROOT_DIR "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}")
  endif()
  set(_saved_env "$ENV{TORCH_CUDA_ARCH_LIST}")
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0")
  unset(TORCH_CUDA_ARCH_LIST)
  find_package(Torch REQUIRED)
  set(ENV{TORCH_CUDA_ARCH_LIST} "${_saved_env}")
  string(REGEX REPLACE "(-gencode|--generate-code)[= ]arch=[^ ]+" "" CMAKE_CUDA_FLAGS
    "${CMAKE_CUDA_FLAGS}")

  if(_requested)
    set(_source "TORCH_CUDA_ARCH_LIST")
  elseif(APHRODITE_TORCH_CAPABILITY)
    # A build for the GPU in this machine: its arch-specific variant where it has one.
    set(_requested "${APHRODITE_TORCH_CAPABILITY}")
    if(_requested VERSION_GREATER_EQUAL 9.0)
      string(APPEND _requested "a")
    endif()
    set(_source "the visible GPU")
  else()
    aphrodite_default_cuda_archs(_requested "${CMAKE_CUDA_COMPILER_VERSION}")
    set(_source "the default list (no TORCH_CUDA_ARCH_LIST, no visible GPU)")
  endif()
  aphrodite_parse_cuda_archs(APHRODITE_CUDA_ARCHS "${_requested}")
  aphrodite_check_cuda_archs_for_toolkit("${APHRODITE_CUDA_ARCHS}"
    "${CMAKE_CUDA_COMPILER_VERSION}")
  # aphrodite_cuda_archs_intersect compiles plain 9.0 beside 9.0a as 9.0a only: say so here,
  # where the list is read, and record the archs that are built.
  _aphrodite_cuda_archs_fold_hopper(APHRODITE_BUILD_ARCHS ${APHRODITE_CUDA_ARCHS})
  if(NOT APHRODITE_BUILD_ARCHS STREQUAL APHRODITE_CUDA_ARCHS)
    message(STATUS "aphrodite_ext: 9.0 is compiled as 9.0a only (9.0a code runs on every 9.0 "
      "GPU); write 9.0+PTX to keep 9.0's PTX as well")
  endif()
  set(APHRODITE_BACKEND_DEFINE APHRODITE_BACKEND_GPU)
  set(APHRODITE_BACKEND_LIBRARIES ${C10_CUDA_LIBRARY} CUDA::cudart)
  message(STATUS "aphrodite_ext: backend cuda, nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
    "archs ${APHRODITE_CUDA_ARCHS} (from ${_source})")
endmacro()

# Decides whether a family is built: sets <prefix>_BUILT, _REASON, _ARCHS, _SOURCES.
function(_aphrodite_backend_family prefix name)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "${APHRODITE_FAMILY_BACKEND_ONE}"
    "${APHRODITE_FAMILY_BACKEND_MULTI}")
  set(${prefix}_BUILT FALSE PARENT_SCOPE)
  if(NOT arg_GPU_SOURCES AND NOT arg_GPU_GENERATOR)
    set(${prefix}_REASON "has no CUDA implementation" PARENT_SCOPE)
    return()
  endif()
  if(arg_MIN_CUDA_VERSION AND CMAKE_CUDA_COMPILER_VERSION VERSION_LESS arg_MIN_CUDA_VERSION)
    set(${prefix}_REASON "needs nvcc >= ${arg_MIN_CUDA_VERSION}, this build has "
      "${CMAKE_CUDA_COMPILER_VERSION}" PARENT_SCOPE)
    return()
  endif()
  aphrodite_parse_cuda_archs(_supported "${arg_CUDA_ARCHS}")
  aphrodite_cuda_archs_intersect(_archs SUPPORTED ${_supported} REQUESTED ${APHRODITE_CUDA_ARCHS})
  if(NOT _archs)
    list(JOIN _supported " " _s)
    list(JOIN APHRODITE_CUDA_ARCHS " " _r)
    set(${prefix}_REASON "supports archs ${_s}, none of which serves the requested ${_r}"
      PARENT_SCOPE)
    return()
  endif()
  set(${prefix}_BUILT TRUE PARENT_SCOPE)
  set(${prefix}_ARCHS ${_archs} PARENT_SCOPE)
  set(${prefix}_SOURCES ${arg_GPU_SOURCES} PARENT_SCOPE)
endfunction()

function(_aphrodite_backend_sources archs)
  aphrodite_cuda_gencode_flags(_flags "${archs}")
  foreach(_src IN LISTS ARGN)
    set_source_files_properties(${_src} PROPERTIES LANGUAGE CUDA COMPILE_OPTIONS "${_flags}")
    set_property(SOURCE ${_src} PROPERTY APHRODITE_ARCHS ${archs})
    set_property(SOURCE ${_src} PROPERTY APHRODITE_FLAGS ${_flags})
  endforeach()
endfunction()

function(_aphrodite_backend_link target)
  get_property(_sources GLOBAL PROPERTY APHRODITE_KERNEL_SOURCES_${target})
  target_sources(${target} PRIVATE ${_sources})
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON CUDA_VISIBILITY_PRESET hidden)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--threads=${APHRODITE_NVCC_THREADS}>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CONFIG:RelWithDebInfo>>:-lineinfo>)
endfunction()
