# The ROCm backend: the CUDA kernel sources compiled as HIP through kernels/rocm/hip_shim.h,
# with --offload-arch flags from each family's intersection with PYTORCH_ROCM_ARCH.
#
# Offers (called by families.cmake):
#   _aphrodite_backend_setup()                     hipcc/clang + torch; parses requested archs
#   _aphrodite_backend_family(<prefix> <name> ...) decides whether a family is built, for what
#   _aphrodite_backend_sources(<archs> <src>...)   sets each source's --offload-arch flags
#   _aphrodite_backend_link(<target>)              adds the kernel sources to a module

macro(_aphrodite_backend_setup)
  include(CheckLanguage)
  check_language(HIP)
  if(NOT CMAKE_HIP_COMPILER)
    message(FATAL_ERROR "APHRODITE_TARGET_DEVICE=rocm needs the ROCm HIP compiler, and none "
      "was found: install ROCm (torch ${APHRODITE_TORCH_FULL} wants HIP ${APHRODITE_TORCH_HIP}) "
      "or set CMAKE_HIP_COMPILER")
  endif()
  set(CMAKE_HIP_ARCHITECTURES OFF)
  enable_language(HIP)
  find_package(Torch REQUIRED)

  set(_requested "${PYTORCH_ROCM_ARCH}")
  if(NOT _requested AND DEFINED ENV{PYTORCH_ROCM_ARCH})
    set(_requested "$ENV{PYTORCH_ROCM_ARCH}")
  endif()
  if(NOT _requested)
    set(_requested ${APHRODITE_CORE_HIP_ARCHS})
  endif()
  aphrodite_parse_hip_archs(APHRODITE_HIP_ARCHS "${_requested}")
  set(APHRODITE_BUILD_ARCHS ${APHRODITE_HIP_ARCHS})
  set(APHRODITE_BACKEND_DEFINE APHRODITE_BACKEND_GPU USE_ROCM)
  find_library(APHRODITE_C10_HIP_LIBRARY c10_hip PATHS "${APHRODITE_TORCH_PREFIX}/../../lib")
  set(APHRODITE_BACKEND_LIBRARIES ${APHRODITE_C10_HIP_LIBRARY} hip::host)
  message(STATUS "aphrodite_ext: backend rocm, archs ${APHRODITE_HIP_ARCHS}")
endmacro()

function(_aphrodite_backend_family prefix name)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "${APHRODITE_FAMILY_BACKEND_ONE}"
    "${APHRODITE_FAMILY_BACKEND_MULTI}")
  set(${prefix}_BUILT FALSE PARENT_SCOPE)
  if(NOT arg_GPU_SOURCES AND NOT arg_GPU_GENERATOR)
    set(${prefix}_REASON "has no GPU implementation" PARENT_SCOPE)
    return()
  endif()
  if(NOT arg_HIP_ARCHS)
    set(${prefix}_REASON "declares no HIP archs (its kernels are CUDA-only for now)" PARENT_SCOPE)
    return()
  endif()
  aphrodite_hip_archs_intersect(_archs SUPPORTED ${arg_HIP_ARCHS} REQUESTED ${APHRODITE_HIP_ARCHS})
  if(NOT _archs)
    list(JOIN arg_HIP_ARCHS " " _s)
    set(${prefix}_REASON "supports ${_s}, none of which was requested" PARENT_SCOPE)
    return()
  endif()
  set(${prefix}_BUILT TRUE PARENT_SCOPE)
  set(${prefix}_ARCHS ${_archs} PARENT_SCOPE)
  set(${prefix}_SOURCES ${arg_GPU_SOURCES} PARENT_SCOPE)
endfunction()

function(_aphrodite_backend_sources archs)
  aphrodite_hip_offload_flags(_flags "${archs}")
  foreach(_src IN LISTS ARGN)
    set_source_files_properties(${_src} PROPERTIES LANGUAGE HIP COMPILE_OPTIONS "${_flags}")
    set_property(SOURCE ${_src} PROPERTY APHRODITE_ARCHS ${archs})
    set_property(SOURCE ${_src} PROPERTY APHRODITE_FLAGS ${_flags})
  endforeach()
endfunction()

function(_aphrodite_backend_link target)
  get_property(_sources GLOBAL PROPERTY APHRODITE_KERNEL_SOURCES_${target})
  target_sources(${target} PRIVATE ${_sources})
  set_target_properties(${target} PROPERTIES HIP_ARCHITECTURES OFF HIP_STANDARD 17)
endfunction()
