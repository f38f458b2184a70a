# Extension modules, kernel families and the build plan.
#
# Offers:
#   aphrodite_add_extension(<name> [BACKENDS cpu cuda rocm])
#       Declares a Python extension module (installed as aphrodite_ext/<name>.abi3.so) and the
#       backends it exists on (all by default). It is built when a family in it is built.
#   aphrodite_add_family(<name> TARGET <module> OPS <op>... BINDING <file.cpp>
#       [GPU_SOURCES <file.cu>...] [GPU_GENERATOR <codegen/x.py> [GENERATOR_OPTIONS <k=v>...]]
#       [CPU_SOURCES <file.cpp>...] [CUDA_ARCHS <arch>...] [HIP_ARCHS <gfx>...]
#       [MIN_CUDA_VERSION <v>] [DEFINES <def>...] [NEEDS <dependency>...])
#       One kernel family. The backend decides whether it is built and for which archs (the
#       intersection of CUDA_ARCHS/HIP_ARCHS with the requested ones, or the CPU ISA builds);
#       built, its sources get per-source arch flags and the module gets
#       APHRODITE_HAS_<NAME>. The BINDING is compiled either way, so that its ops exist and,
#       where the family was skipped, raise the recorded reason.
#       NEEDS names header/library dependencies by their aphrodite::<dependency> target (e.g.
#       `cute`, from cmake/cutlass.cmake): the family is skipped when one is missing, with the
#       reason the dependency's finder recorded (APHRODITE_<DEP>_MISSING_REASON, else a generic
#       one), and built, the target is linked into the module.
#   APHRODITE_DISABLE_FAMILIES (cache; setup.py passes the environment variable of that name on
#       every configure)
#       Families to leave out of this build (e.g. for a fast development build); their ops
#       still exist and say that they were disabled.
#   aphrodite_finalize()
#       Checks that every APHRODITE_GENERATOR_OPTIONS entry names a family with a generator,
#       creates the modules that have a built family, installs them, and writes plan.json
#       (also installed as aphrodite_ext/_build_info.json).

set(APHRODITE_DISABLE_FAMILIES "" CACHE STRING "Kernel families to leave out of this build")

# The keywords a backend's _aphrodite_backend_family() receives.
set(APHRODITE_FAMILY_BACKEND_ONE MIN_CUDA_VERSION GPU_GENERATOR)
set(APHRODITE_FAMILY_BACKEND_MULTI GPU_SOURCES CPU_SOURCES CUDA_ARCHS HIP_ARCHS)

function(aphrodite_add_extension name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "BACKENDS")
  if(NOT arg_BACKENDS)
    set(arg_BACKENDS cpu cuda rocm)
  endif()
  set_property(GLOBAL APPEND PROPERTY APHRODITE_EXTENSIONS ${name})
  set_property(GLOBAL PROPERTY APHRODITE_EXTENSION_BACKENDS_${name} ${arg_BACKENDS})
endfunction()

function(aphrodite_add_family name)
  set(_one TARGET BINDING GPU_GENERATOR MIN_CUDA_VERSION)
  set(_multi OPS GPU_SOURCES CPU_SOURCES CUDA_ARCHS HIP_ARCHS DEFINES GENERATOR_OPTIONS NEEDS)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "${_one}" "${_multi}")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "aphrodite_add_family(${name}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  get_property(_extensions GLOBAL PROPERTY APHRODITE_EXTENSIONS)
  if(NOT arg_TARGET IN_LIST _extensions)
    message(FATAL_ERROR "aphrodite_add_family(${name}): TARGET '${arg_TARGET}' is not declared "
      "with aphrodite_add_extension(); declared: ${_extensions}")
  endif()
  foreach(_required OPS BINDING)
    if(NOT arg_${_required})
      message(FATAL_ERROR "aphrodite_add_family(${name}): ${_required} is required")
    endif()
  endforeach()
  get_property(_families GLOBAL PROPERTY APHRODITE_FAMILIES)
  if(name IN_LIST _families)
    message(FATAL_ERROR "aphrodite_add_family(${name}): a family of that name already exists")
  endif()
  set_property(GLOBAL APPEND PROPERTY APHRODITE_FAMILIES ${name})
  if(arg_GPU_GENERATOR)
    set_property(GLOBAL APPEND PROPERTY APHRODITE_GENERATED_FAMILIES ${name})
  endif()

  get_property(_backends GLOBAL PROPERTY APHRODITE_EXTENSION_BACKENDS_${arg_TARGET})
  set(fam_ARCHS "")
  set(fam_SOURCES "")
  if(NOT APHRODITE_DEVICE IN_LIST _backends)
    set(fam_BUILT FALSE)
    set(fam_REASON "belongs to ${arg_TARGET}, which exists on ${_backends} only")
  elseif(name IN_LIST APHRODITE_DISABLE_FAMILIES)
    set(fam_BUILT FALSE)
    set(fam_REASON "is disabled by APHRODITE_DISABLE_FAMILIES")
  else()
    _aphrodite_backend_family(fam ${name}
      GPU_SOURCES ${arg_GPU_SOURCES} GPU_GENERATOR ${arg_GPU_GENERATOR}
      CPU_SOURCES ${arg_CPU_SOURCES} CUDA_ARCHS ${arg_CUDA_ARCHS} HIP_ARCHS ${arg_HIP_ARCHS}
      MIN_CUDA_VERSION ${arg_MIN_CUDA_VERSION})
  endif()
  # Dependencies come last: a family its archs already rule out says so, not that a header
  # library is missing.
  if(fam_BUILT)
    foreach(_dep IN LISTS arg_NEEDS)
      if(NOT TARGET aphrodite::${_dep})
        string(TOUPPER "${_dep}" _dep_upper)
        set(fam_BUILT FALSE)
        if(APHRODITE_${_dep_upper}_MISSING_REASON)
          set(fam_REASON "needs ${_dep}, and ${APHRODITE_${_dep_upper}_MISSING_REASON}")
        else()
          set(fam_REASON "needs ${_dep}, which this build did not find")
        endif()
        break()
      endif()
    endforeach()
  endif()

  string(TOUPPER "${name}" _upper)
  set(_generates FALSE)
  if(fam_BUILT)
    if(arg_GPU_GENERATOR AND NOT APHRODITE_DEVICE STREQUAL "cpu")
      aphrodite_generate(_generated NAME ${name} GENERATOR ${arg_GPU_GENERATOR}
        ARCHS ${fam_ARCHS} OPTIONS backend=${APHRODITE_DEVICE} ${arg_GENERATOR_OPTIONS})
      list(APPEND fam_SOURCES ${_generated})
      set(_generates TRUE)
    endif()
    list(TRANSFORM fam_SOURCES PREPEND "${PROJECT_SOURCE_DIR}/" REGEX "^[^/]")
    _aphrodite_backend_sources("${fam_ARCHS}" ${fam_SOURCES})
    if(arg_DEFINES)
      set_property(SOURCE ${fam_SOURCES} APPEND PROPERTY COMPILE_DEFINITIONS ${arg_DEFINES})
    endif()
    set_property(GLOBAL APPEND PROPERTY APHRODITE_KERNEL_SOURCES_${arg_TARGET} ${fam_SOURCES})
    list(TRANSFORM arg_NEEDS PREPEND "aphrodite::" OUTPUT_VARIABLE _needs_targets)
    set_property(GLOBAL APPEND PROPERTY APHRODITE_LINKS_${arg_TARGET} ${_needs_targets})
    set_property(GLOBAL APPEND PROPERTY APHRODITE_DEFINES_${arg_TARGET} APHRODITE_HAS_${_upper})
    list(JOIN fam_ARCHS " " _archs_text)
    set(_status "built for ${_archs_text}")
  else()
    set(_status "was skipped: it ${fam_REASON}")
  endif()
  if(arg_GPU_GENERATOR AND NOT _generates)
    if(fam_BUILT)
      set(_why "is built for ${APHRODITE_DEVICE} from its fixed CPU sources")
    else()
      set(_why "${fam_REASON}")
    endif()
    aphrodite_check_generator_options(NAME ${name} GENERATOR ${arg_GPU_GENERATOR} WHY "${_why}"
      ARCHS ${arg_CUDA_ARCHS} OPTIONS ${arg_GENERATOR_OPTIONS})
  endif()

  set(_binding "${PROJECT_SOURCE_DIR}/${arg_BINDING}")
  if(NOT EXISTS "${_binding}")
    message(FATAL_ERROR "aphrodite_add_family(${name}): BINDING ${arg_BINDING} does not exist")
  endif()
  string(REPLACE "\"" "'" _status_c "${_status}")
  if(fam_BUILT)
    set(_built01 1)
  else()
    set(_built01 0)
  endif()
  set_property(SOURCE "${_binding}" APPEND PROPERTY COMPILE_DEFINITIONS
    "APHRODITE_FAMILY_NAME=\"${name}\"" "APHRODITE_FAMILY_STATUS=\"${_status_c}\""
    "APHRODITE_FAMILY_BUILT=${_built01}" ${arg_DEFINES})
  set_property(GLOBAL APPEND PROPERTY APHRODITE_BINDINGS_${arg_TARGET} "${_binding}")

  foreach(_field TARGET OPS)
    set_property(GLOBAL PROPERTY APHRODITE_FAMILY_${name}_${_field} ${arg_${_field}})
  endforeach()
  foreach(_field BUILT REASON ARCHS SOURCES)
    set_property(GLOBAL PROPERTY APHRODITE_FAMILY_${name}_${_field} ${fam_${_field}})
  endforeach()
endfunction()

# JSON helpers: a string, and an array of strings.
function(_aphrodite_json_string out value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  set(${out} "\"${value}\"" PARENT_SCOPE)
endfunction()

function(_aphrodite_json_array out)
  set(_items "")
  foreach(_v IN LISTS ARGN)
    _aphrodite_json_string(_q "${_v}")
    list(APPEND _items "${_q}")
  endforeach()
  list(JOIN _items ", " _joined)
  set(${out} "[${_joined}]" PARENT_SCOPE)
endfunction()

# A torch extension must share torch's libstdc++: a GCC toolchain without a shared one links
# a static copy into the module, whose uninitialised iostreams crash on the first error
# message (seen with a compiler under /opt/gcc).
function(_aphrodite_check_shared_libstdcxx)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
    OUTPUT_VARIABLE _lib OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_lib}")
    message(FATAL_ERROR "The C++ compiler ${CMAKE_CXX_COMPILER} has no shared libstdc++, so "
      "the modules would carry a static copy that crashes beside torch's: build with a "
      "compiler that has one, e.g. CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++")
  endif()
endfunction()

function(_aphrodite_create_module target)
  get_property(_bindings GLOBAL PROPERTY APHRODITE_BINDINGS_${target})
  Python3_add_library(${target} MODULE USE_SABI 3.10 WITH_SOABI
    "${PROJECT_SOURCE_DIR}/kernels/common/module.cpp" ${_bindings})
  get_property(_defines GLOBAL PROPERTY APHRODITE_DEFINES_${target})
  target_compile_definitions(${target} PRIVATE APHRODITE_MODULE_NAME=${target}
    ${APHRODITE_BACKEND_DEFINE} ${_defines})
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/kernels")
  # torch and c10 (plus c10_cuda on GPU backends): what the bindings use, not all of
  # TORCH_LIBRARIES, which names libraries (nvrtc, ...) a runtime-only toolkit lacks.
  get_property(_links GLOBAL PROPERTY APHRODITE_LINKS_${target})
  list(REMOVE_DUPLICATES _links)
  target_link_libraries(${target} PRIVATE torch ${APHRODITE_BACKEND_LIBRARIES} ${_links})
  set_target_properties(${target} PROPERTIES CXX_STANDARD ${APHRODITE_TORCH_CXX_STANDARD}
    CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF CXX_VISIBILITY_PRESET hidden
    POSITION_INDEPENDENT_CODE ON)
  _aphrodite_backend_link(${target})
  install(TARGETS ${target} LIBRARY DESTINATION aphrodite_ext COMPONENT ${target})
endfunction()

function(aphrodite_finalize)
  get_property(_extensions GLOBAL PROPERTY APHRODITE_EXTENSIONS)
  get_property(_families GLOBAL PROPERTY APHRODITE_FAMILIES)

  _aphrodite_check_shared_libstdcxx()
  set(_family_json "{}")
  foreach(_unknown IN LISTS APHRODITE_DISABLE_FAMILIES)
    if(NOT _unknown IN_LIST _families)
      message(FATAL_ERROR "APHRODITE_DISABLE_FAMILIES names '${_unknown}', which is not a "
        "kernel family; families: ${_families}")
    endif()
  endforeach()
  # A generator option for a family that has no generator would be ignored, and the build would
  # compile the full grids it meant to narrow: say so now. (A family's generator checks its own
  # keys and values at configure, on every backend: aphrodite_check_generator_options where this
  # build does not generate the family.)
  get_property(_generated GLOBAL PROPERTY APHRODITE_GENERATED_FAMILIES)
  list(JOIN _generated ", " _generated_text)
  foreach(_entry IN LISTS APHRODITE_GENERATOR_OPTIONS)
    string(REGEX REPLACE "\\..*$" "" _family "${_entry}")
    if(NOT _family IN_LIST _families)
      message(FATAL_ERROR "APHRODITE_GENERATOR_OPTIONS entry '${_entry}' names '${_family}', which "
        "is not a kernel family; the families with a generator are ${_generated_text}")
    elseif(NOT _family IN_LIST _generated)
      message(FATAL_ERROR "APHRODITE_GENERATOR_OPTIONS entry '${_entry}': the ${_family} family "
        "has no generator (its sources are fixed); the families with one are ${_generated_text}")
    endif()
  endforeach()
  foreach(_f IN LISTS _families)
    foreach(_field TARGET OPS BUILT REASON ARCHS SOURCES GENERATOR_OPTIONS)
      get_property(_${_field} GLOBAL PROPERTY APHRODITE_FAMILY_${_f}_${_field})
    endforeach()
    set(_sources_json "[]")
    foreach(_src IN LISTS _SOURCES)
      get_property(_src_archs SOURCE ${_src} PROPERTY APHRODITE_ARCHS)
      get_property(_src_flags SOURCE ${_src} PROPERTY APHRODITE_FLAGS)
      file(RELATIVE_PATH _rel "${PROJECT_SOURCE_DIR}" "${_src}")
      _aphrodite_json_string(_path "${_rel}")
      _aphrodite_json_array(_a ${_src_archs})
      _aphrodite_json_array(_fl ${_src_flags})
      string(JSON _len LENGTH "${_sources_json}")
      string(JSON _sources_json SET "${_sources_json}" ${_len}
        "{\"path\": ${_path}, \"archs\": ${_a}, \"flags\": ${_fl}}")
    endforeach()
    _aphrodite_json_string(_t "${_TARGET}")
    _aphrodite_json_array(_ops ${_OPS})
    _aphrodite_json_array(_archs ${_ARCHS})
    _aphrodite_json_string(_reason "${_REASON}")
    _aphrodite_json_array(_generator_options ${_GENERATOR_OPTIONS})
    if(_BUILT)
      set(_b true)
      set_property(GLOBAL APPEND PROPERTY _APHRODITE_BUILT_FAMILIES_${_TARGET} ${_f})
    else()
      set(_b false)
    endif()
    string(JSON _family_json SET "${_family_json}" ${_f} "{\"module\": ${_t}, \"built\": ${_b},
      \"archs\": ${_archs}, \"reason\": ${_reason}, \"ops\": ${_ops}, \"sources\": ${_sources_json},
      \"generator_options\": ${_generator_options}}")
  endforeach()

  set(_module_json "{}")
  set(_built_modules "")
  foreach(_m IN LISTS _extensions)
    get_property(_backends GLOBAL PROPERTY APHRODITE_EXTENSION_BACKENDS_${_m})
    get_property(_built_families GLOBAL PROPERTY _APHRODITE_BUILT_FAMILIES_${_m})
    get_property(_bindings GLOBAL PROPERTY APHRODITE_BINDINGS_${_m})
    if(NOT APHRODITE_DEVICE IN_LIST _backends)
      set(_reason "exists on ${_backends} only")
    elseif(NOT _bindings)
      set(_reason "has no kernel family declared yet")
    elseif(NOT _built_families)
      set(_reason "has none of its families built for this configuration")
    else()
      set(_reason "")
      list(APPEND _built_modules ${_m})
      _aphrodite_create_module(${_m})
    endif()
    if(_reason)
      set(_b false)
    else()
      set(_b true)
    endif()
    _aphrodite_json_string(_r "${_reason}")
    _aphrodite_json_array(_fams ${_built_families})
    string(JSON _module_json SET "${_module_json}" ${_m}
      "{\"built\": ${_b}, \"reason\": ${_r}, \"built_families\": ${_fams}}")
  endforeach()
  if(NOT _built_modules)
    message(FATAL_ERROR "no kernel family is left to build for ${APHRODITE_DEVICE}"
      " (APHRODITE_DISABLE_FAMILIES: ${APHRODITE_DISABLE_FAMILIES}); leave at least one in")
  endif()

  _aphrodite_json_array(_requested ${APHRODITE_BUILD_ARCHS})
  set(_toolchain "{}")
  foreach(_pair "cmake;${CMAKE_VERSION}"
      "cxx;${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}"
      "cuda;${CMAKE_CUDA_COMPILER_VERSION}" "hip;${CMAKE_HIP_COMPILER_VERSION}"
      "generator;${CMAKE_GENERATOR}" "build_type;${CMAKE_BUILD_TYPE}")
    list(GET _pair 0 _k)
    list(GET _pair 1 _v)
    _aphrodite_json_string(_v "${_v}")
    string(JSON _toolchain SET "${_toolchain}" ${_k} "${_v}")
  endforeach()
  foreach(_k VERSION FULL CUDA HIP CXX_STANDARD)
    _aphrodite_json_string(_torch_${_k} "${APHRODITE_TORCH_${_k}}")
  endforeach()
  _aphrodite_json_string(_version "${APHRODITE_VERSION}")
  _aphrodite_json_string(_device "${APHRODITE_DEVICE}")
  set(_plan "{
  \"version\": ${_version},
  \"backend\": ${_device},
  \"archs\": ${_requested},
  \"torch\": {\"version\": ${_torch_VERSION}, \"full\": ${_torch_FULL}, \"cuda\": ${_torch_CUDA},
            \"hip\": ${_torch_HIP}, \"cxx_standard\": ${_torch_CXX_STANDARD}},
  \"toolchain\": ${_toolchain},
  \"modules\": ${_module_json},
  \"families\": ${_family_json}
}")
  # Re-serialise through string(JSON) so that the file is valid, indented JSON.
  string(JSON _pretty SET "${_plan}" version "${_version}")
  file(WRITE "${CMAKE_BINARY_DIR}/plan.json" "${_pretty}\n")
  install(FILES "${CMAKE_BINARY_DIR}/plan.json" DESTINATION aphrodite_ext
    RENAME _build_info.json COMPONENT build_info)
  list(JOIN _built_modules " " _mods)
  message(STATUS "aphrodite_ext: modules built: ${_mods}; plan: ${CMAKE_BINARY_DIR}/plan.json")
endfunction()
