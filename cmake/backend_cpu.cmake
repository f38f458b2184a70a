# The CPU backend: every family's CPU sources are compiled once per ISA into object libraries
# linked into the module; kernels/cpu/cpu_isa.h picks one at run time from the running CPU.
#
# Offers (called by families.cmake):
#   _aphrodite_backend_setup()                 finds torch; sets APHRODITE_CPU_ISAS
#   _aphrodite_backend_family(<prefix> <name> ...) decides whether a family is built, for what
#   _aphrodite_backend_sources(<archs> <src>...)  per-source settings of a built family
#   _aphrodite_backend_link(<target>)          adds the per-ISA objects to a module

# ISA builds per processor, with the flags each one compiles with. The build machine's own CPU
# plays no part: a module built anywhere carries every build and runs on any CPU of its kind.
set(_APHRODITE_CPU_FLAGS_scalar "")
set(_APHRODITE_CPU_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(_APHRODITE_CPU_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)

macro(_aphrodite_backend_setup)
  # A CUDA build of torch looks its toolkit up even for a CPU-only extension.
  if(APHRODITE_TORCH_CUDA AND NOT CUDA_TOOLKIT_ROOT_DIR)
    find_path(CUDA_TOOLKIT_ROOT_DIR include/cuda_runtime.h PATHS ENV CUDA_HOME /usr/local/cuda)
  endif()
  find_package(Torch REQUIRED)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    set(APHRODITE_CPU_ISAS scalar avx2 avx512)
  else()
    set(APHRODITE_CPU_ISAS scalar)
  endif()
  set(APHRODITE_BACKEND_DEFINE APHRODITE_BACKEND_CPU)
  set(APHRODITE_BUILD_ARCHS ${APHRODITE_CPU_ISAS})
  message(STATUS "aphrodite_ext: backend cpu, ISA builds: ${APHRODITE_CPU_ISAS}")
endmacro()

# Decides whether a family is built: sets <prefix>_BUILT, _REASON, _ARCHS, _SOURCES.
function(_aphrodite_backend_family prefix name)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "${APHRODITE_FAMILY_BACKEND_ONE}"
    "${APHRODITE_FAMILY_BACKEND_MULTI}")
  if(NOT arg_CPU_SOURCES)
    set(${prefix}_BUILT FALSE PARENT_SCOPE)
    set(${prefix}_REASON "has no CPU implementation" PARENT_SCOPE)
    return()
  endif()
  set(${prefix}_BUILT TRUE PARENT_SCOPE)
  set(${prefix}_ARCHS ${APHRODITE_CPU_ISAS} PARENT_SCOPE)
  set(${prefix}_SOURCES ${arg_CPU_SOURCES} PARENT_SCOPE)
endfunction()

# Per-source settings of a built family's kernel sources.
function(_aphrodite_backend_sources archs)
  set(_flags "")
  foreach(_isa IN LISTS archs)
    list(JOIN _APHRODITE_CPU_FLAGS_${_isa} " " _isa_flags)
    list(APPEND _flags "${_isa}: -DAPHRODITE_CPU_ISA=${_isa} ${_isa_flags}")
  endforeach()
  foreach(_src IN LISTS ARGN)
    set_property(SOURCE ${_src} PROPERTY APHRODITE_ARCHS ${archs})
    set_property(SOURCE ${_src} PROPERTY APHRODITE_FLAGS ${_flags})
  endforeach()
endfunction()

function(_aphrodite_backend_link target)
  get_property(_sources GLOBAL PROPERTY APHRODITE_KERNEL_SOURCES_${target})
  if(NOT _sources)
    return()
  endif()
  target_sources(${target} PRIVATE "${PROJECT_SOURCE_DIR}/kernels/cpu/cpu_isa_ops.cpp")
  # The bindings split rows over threads with at::parallel_for, a header template that runs
  # the whole range on the calling thread unless the file is compiled with OpenMP (torch's CPU
  # builds use OpenMP; at run time the module shares the libgomp that torch has loaded, same
  # soname).
  find_package(OpenMP COMPONENTS CXX)
  if(OpenMP_CXX_FOUND)
    target_link_libraries(${target} PRIVATE OpenMP::OpenMP_CXX)
  else()
    message(WARNING "aphrodite_ext: no OpenMP for the C++ compiler; CPU ops of ${target} will "
      "run on one thread")
  endif()
  foreach(_isa IN LISTS APHRODITE_CPU_ISAS)
    set(_lib ${target}_cpu_${_isa})
    add_library(${_lib} OBJECT ${_sources})
    target_include_directories(${_lib} PRIVATE "${PROJECT_SOURCE_DIR}/kernels")
    target_compile_definitions(${_lib} PRIVATE APHRODITE_CPU_ISA=${_isa} APHRODITE_BACKEND_CPU)
    target_compile_options(${_lib} PRIVATE ${_APHRODITE_CPU_FLAGS_${_isa}})
    set_target_properties(${_lib} PROPERTIES POSITION_INDEPENDENT_CODE ON
      CXX_STANDARD 17 CXX_EXTENSIONS OFF CXX_VISIBILITY_PRESET hidden)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${_lib}>)
    string(TOUPPER ${_isa} _upper)
    target_compile_definitions(${target} PRIVATE APHRODITE_CPU_HAS_${_upper}=1)
  endforeach()
endfunction()
