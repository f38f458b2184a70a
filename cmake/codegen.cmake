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
#       build directories hold separate outputs.
#
#   APHRODITE_GENERATOR_OPTIONS (cache)
#       "<name>.<key>=<value>;..." narrows a generator's grid for fast development builds, e.g.
#       "activation.dtypes=bf16"; each entry goes to the generator of that family, which rejects
#       keys and values it does not have when configure asks it for its outputs
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

function(aphrodite_generate out_var)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "NAME;GENERATOR" "ARCHS;OPTIONS")
  cmake_path(ABSOLUTE_PATH arg_GENERATOR BASE_DIRECTORY "${PROJECT_SOURCE_DIR}"
    OUTPUT_VARIABLE _generator)
  set(_out_dir "${CMAKE_BINARY_DIR}/generated/${arg_NAME}")
  list(JOIN arg_ARCHS " " _archs)
  set(_args --out-dir "${_out_dir}" --archs "${_archs}")
  foreach(_entry IN LISTS APHRODITE_GENERATOR_OPTIONS)
    if(_entry MATCHES "^${arg_NAME}\\.(.+)$")
      list(APPEND arg_OPTIONS "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  foreach(_opt IN LISTS arg_OPTIONS)
    list(APPEND _args --option "${_opt}")
  endforeach()

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
