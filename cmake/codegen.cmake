# Code generators as build-graph nodes.
#
# Offers:
#   aphrodite_generate(<out_var> NAME <name> GENERATOR <codegen/x.py> [ARCHS <arch>...]
#                      [OPTIONS <key=value>...])
#       Runs the generator at build time (not at configure) into
#       ${CMAKE_BINARY_DIR}/generated/<name>/ and returns its output files, an explicit list
#       the generator reports at configure. The generator writes a file only when its content
#       changes and skips all work when the content hash of everything that shapes the output
#       (the generator, the codegen modules it imports, its templates, the archs, the options)
#       matches its stamp: an unchanged rebuild regenerates and recompiles nothing. Separate
#       build directories hold separate outputs. The APHRODITE_GENERATOR_OPTIONS entries for
#       <name> go on the global property APHRODITE_FAMILY_<name>_GENERATOR_OPTIONS, which
#       aphrodite_finalize records in the build plan.
#
#   aphrodite_check_generator_options(NAME <name> GENERATOR <codegen/x.py> WHY <text>
#                                     [ARCHS <arch>...] [OPTIONS <key=value>...])
#       For a family this build does not generate (the CPU backend, a family skipped or
#       disabled): where APHRODITE_GENERATOR_OPTIONS names it, asks its generator to describe
#       its CUDA grid under those options (nothing is written), so that a misspelt key or value
#       stops this configure too, not only a later build that generates the family. WHY says
#       why the family is not generated here; ARCHS are the archs it supports.
#
#   APHRODITE_GENERATOR_OPTIONS (cache)
#       "<name>.<key>=<value>;..." narrows a generator's grid for fast development builds, e.g.
#       "activation.dtypes=bf16"; each entry goes to the generator of that family, which rejects
#       keys and values it does not have when configure asks it for its outputs, or, where this
#       build does not generate the family, when aphrodite_check_generator_options asks
#       (aphrodite_finalize rejects entries for families without a generator).

set(APHRODITE_GENERATOR_OPTIONS "" CACHE STRING
  "Generator options, <family>.<key>=<value>;... (e.g. activation.dtypes=bf16)")
foreach(_entry IN LISTS APHRODITE_GENERATOR_OPTIONS)
  if(NOT _entry MATCHES "^[a-z0-9_]+\\.[a-z0-9_]+=.+$")
    message(FATAL_ERROR "APHRODITE_GENERATOR_OPTIONS entry '${_entry}' is not of the form "
      "<family>.<key>=<value>, e.g. activation.dtypes=bf16")
  endif()
  if(_entry MATCHES "^[a-z0-9_]+\\.backend=")
    message(FATAL_ERROR "APHRODITE_GENERATOR_OPTIONS entry '${_entry}': a generator's backend "
      "is the build's (APHRODITE_TARGET_DEVICE), not an option")
  endif()
endforeach()

# The generator's command line: --out-dir, --archs and an --option for each of `options` and of
# the APHRODITE_GENERATOR_OPTIONS entries for `name`; `chosen_var`: those entries (key=value,
# the family's name taken off), empty where none names it.
function(_aphrodite_generator_args out_var chosen_var name out_dir archs)
  list(JOIN archs " " _archs)
  set(_args --out-dir "${out_dir}" --archs "${_archs}")
  set(_chosen "")
  foreach(_entry IN LISTS APHRODITE_GENERATOR_OPTIONS)
    if(_entry MATCHES "^${name}\\.(.+)$")
      list(APPEND _chosen "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  foreach(_opt IN LISTS ARGN _chosen)
    list(APPEND _args --option "${_opt}")
  endforeach()
  set(${out_var} "${_args}" PARENT_SCOPE)
  set(${chosen_var} "${_chosen}" PARENT_SCOPE)
endfunction()

function(aphrodite_check_generator_options)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;GENERATOR;WHY" "ARCHS;OPTIONS")
  cmake_path(ABSOLUTE_PATH arg_GENERATOR BASE_DIRECTORY "${PROJECT_SOURCE_DIR}"
    OUTPUT_VARIABLE _generator)
  # The arch-specific targets (9.0a, ...) of the supported archs too: a grid may hold blocks
  # only they build (marlin's wgmma shapes).
  set(_archs ${arg_ARCHS})
  foreach(_arch IN LISTS arg_ARCHS)
    if(_arch VERSION_GREATER_EQUAL 9.0)
      list(APPEND _archs "${_arch}a")
    endif()
  endforeach()
  _aphrodite_generator_args(_args _chosen ${arg_NAME} "${CMAKE_BINARY_DIR}/generated/${arg_NAME}"
    "${_archs}" backend=cuda ${arg_OPTIONS})
  if("${_chosen}" STREQUAL "")
    return()
  endif()
  execute_process(COMMAND "${Python3_EXECUTABLE}" "${_generator}" ${_args} --describe
    OUTPUT_QUIET ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    string(STRIP "${_err}" _err)
    message(FATAL_ERROR "APHRODITE_GENERATOR_OPTIONS for ${arg_NAME}, which this build does not "
      "generate (it ${arg_WHY}), checked against its CUDA grid: ${_err}")
  endif()
endfunction()

function(aphrodite_generate out_var)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "NAME;GENERATOR" "ARCHS;OPTIONS")
  cmake_path(ABSOLUTE_PATH arg_GENERATOR BASE_DIRECTORY "${PROJECT_SOURCE_DIR}"
    OUTPUT_VARIABLE _generator)
  set(_out_dir "${CMAKE_BINARY_DIR}/generated/${arg_NAME}")
  _aphrodite_generator_args(_args _chosen ${arg_NAME} "${_out_dir}" "${arg_ARCHS}" ${arg_OPTIONS})
  # What narrowed this family's grid, for the build plan (aphrodite_finalize records it).
  set_property(GLOBAL PROPERTY APHRODITE_FAMILY_${arg_NAME}_GENERATOR_OPTIONS ${_chosen})

  # The output list and the inputs are facts of the generator's grid; ask it (cheap).
  execute_process(COMMAND "${Python3_EXECUTABLE}" "${_generator}" ${_args} --describe
    OUTPUT_VARIABLE _description ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "aphrodite_generate(${arg_NAME}): ${arg_GENERATOR} failed:\n${_err}")
  endif()
  string(JSON _n_out LENGTH "${_description}" outputs)
  string(JSON _n_in LENGTH "${_description}" inputs)
  set(_outputs "")
  set(_inputs "")
  math(EXPR _last_out "${_n_out} - 1")
  foreach(_i RANGE ${_last_out})
    string(JSON _o GET "${_description}" outputs ${_i})
    list(APPEND _outputs "${_out_dir}/${_o}")
  endforeach()
  math(EXPR _last_in "${_n_in} - 1")
  foreach(_i RANGE ${_last_in})
    string(JSON _in GET "${_description}" inputs ${_i})
    list(APPEND _inputs "${_in}")
    if(_in MATCHES "\\.py$")
      # A change to the Python may change the output list: configure again.
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_in}")
    endif()
  endforeach()

  add_custom_command(
    OUTPUT ${_outputs}
    COMMAND "${Python3_EXECUTABLE}" "${_generator}" ${_args}
    DEPENDS ${_inputs}
    COMMENT "Generating ${arg_NAME} (${_n_out} files)"
    VERBATIM)
  add_custom_target(aphrodite_generate_${arg_NAME} DEPENDS ${_outputs})
  set(${out_var} ${_outputs} PARENT_SCOPE)
endfunction()
