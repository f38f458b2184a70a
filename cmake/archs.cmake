# cmake/archs.cmake -- GPU architecture lists for aphrodite-ext.
#
# Everything here is a pure function: it only sets <out_var> in the caller's
# scope, or stops with message(FATAL_ERROR "<what is wrong and what to write
# instead>").  The file can be include()d from CMakeLists.txt and from
# `cmake -P` scripts alike.  Needs CMake >= 3.26.
#
# List arguments may be passed quoted ("${LIST}") or unquoted (${LIST}).
#
# CUDA arch syntax: MAJOR.MINOR, optionally followed by the suffix `a`
# (arch-specific features, e.g. 9.0a) or `f` (family-portable, e.g. 10.0f),
# optionally followed by `+PTX` (also embed PTX for forward compatibility).
# A "normalised" list is sorted by version (then plain < a < f), has no
# duplicates, and X.Y together with X.Y+PTX is merged into X.Y+PTX.
#
# Public functions
# ----------------
#   aphrodite_parse_cuda_archs(<out_var> <arch_string>...
#                              [TOOLKIT_VERSION <nvcc_version>] [SOURCE <name>])
#       Validate a TORCH_CUDA_ARCH_LIST-style string (space and/or `;`
#       separated) and return it normalised.  With TOOLKIT_VERSION, also
#       run aphrodite_check_cuda_archs_for_toolkit() on the result.  SOURCE
#       names where the string came from, for error messages.
#
#   aphrodite_check_cuda_archs_for_toolkit(<archs>... <nvcc_version>)
#       Stop with an error if any arch cannot be compiled by that nvcc.
#
#   aphrodite_cuda_archs_for_toolkit(<out_var> <nvcc_version>)
#       The plain MAJOR.MINOR archs that nvcc version can compile.
#
#   aphrodite_cuda_archs_intersect(<out_var> SUPPORTED <archs>...
#                                  REQUESTED <archs>...)
#       Which archs a kernel family (SUPPORTED) gets compiled for, given what
#       the user asked for (REQUESTED).  Both lists must be normalised.
#       For each requested arch R (version X.Y, suffix "", a or f, maybe
#       +PTX), the candidates are the supported archs S of the same major
#       with version <= X.Y, leaving out Jetson-only S (5.3 6.2 7.2 8.7 11.0)
#       unless S has exactly R's version.  A candidate is compatible when:
#         - S is plain: always.  Emits S's version, except that when S has
#           R's version and R has the `a` suffix it emits R (plain code may
#           be compiled as arch-specific code); e.g. 9.0 vs 9.0a -> 9.0a.
#         - S has `a`: only if R is the same version with the `a` suffix.
#           Emits S.  (9.0a vs 9.0 -> nothing.)
#         - S has `f`: R's version >= S's version (same major, any suffix).
#           Emits S.  (10.0f vs 10.3 -> 10.0f; 10.0f vs 12.1 -> nothing.)
#       The highest compatible candidate wins (highest version; on a tie the
#       one whose suffix equals R's, else plain < a < f).
#       If there is no same-major candidate, a lower-major plain S may serve
#       R through PTX when R has +PTX or S has +PTX (e.g. 8.0+PTX vs 12.0 ->
#       8.0+PTX); the highest non-Jetson one is taken and emitted as S+PTX.
#       Whenever R has +PTX, the emitted arch gets +PTX too.
#       Plain 9.0 (without +PTX) is dropped where 9.0a is emitted too: Hopper's
#       9.0a code serves every GPU plain 9.0 code does (9.0 9.0a -> 9.0a). Plain
#       10.0 or 12.0 stays beside 10.0a / 12.0a: it also serves 10.3 / 12.1.
#       The result is normalised (so independent of input order) and may be
#       empty; the caller decides what to report then.
#
#   aphrodite_cuda_gencode_flags(<out_var> <archs>...)
#       -gencode=arch=compute_XY[s],code=sm_XY[s] for each arch, plus
#       -gencode=arch=compute_XY[s],code=compute_XY[s] for +PTX archs.
#
#   aphrodite_default_cuda_archs(<out_var> <nvcc_version>)
#       The release default used when nothing is requested and no GPU is
#       visible: 7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX, reduced to what that nvcc
#       can compile, with +PTX on the newest arch that remains.
#
#   aphrodite_parse_hip_archs(<out_var> <arch_string>... [SOURCE <name>])
#       Validate gfx names against the known table; returns them
#       deduplicated, in table order.
#
#   aphrodite_hip_archs_intersect(<out_var> SUPPORTED <archs>...
#                                 REQUESTED <archs>...)
#       Exact set intersection, in table order.
#
#   aphrodite_hip_offload_flags(<out_var> <archs>...)
#       --offload-arch=<gfx> for each arch.

include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.26)
  message(FATAL_ERROR
    "cmake/archs.cmake needs CMake >= 3.26 (found ${CMAKE_VERSION}); "
    "install a newer cmake, e.g. `pip install cmake`.")
endif()
# Functions remember the policies in effect where they are defined, so this
# pins 3.26 behaviour (quoted if() arguments are never dereferenced, ...) for
# everything below, even when included from a `cmake -P` script that set none.
# include() gives this file its own policy scope, so the caller is unaffected.
cmake_policy(VERSION 3.26)

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

# Known CUDA archs, one row each:
#   version  jetson-only  first-nvcc  first-nvcc-without-it (- = still there)  suffixes (- = none)
function(_aphrodite_cuda_arch_table out_var)
  set(${out_var}
    "5.0   0  6.0   13.0  -"    # Maxwell: GTX 750 / 750 Ti, Quadro K620
    "5.2   0  6.5   13.0  -"    # Maxwell: GTX 9xx, Tesla M40 / M60
    "5.3   1  7.0   13.0  -"    # Maxwell (Tegra X1): Jetson TX1 / Nano
    "6.0   0  8.0   13.0  -"    # Pascal: Tesla P100
    "6.1   0  8.0   13.0  -"    # Pascal: GTX 10xx, Tesla P4 / P40
    "6.2   1  8.0   13.0  -"    # Pascal (Tegra): Jetson TX2
    "7.0   0  9.0   13.0  -"    # Volta: Tesla V100, Titan V
    "7.2   1  10.0  13.0  -"    # Volta (Tegra): Jetson AGX Xavier / Xavier NX
    "7.5   0  10.0  -     -"    # Turing: T4, RTX 20xx, Quadro RTX
    "8.0   0  11.0  -     -"    # Ampere: A100, A30
    "8.6   0  11.1  -     -"    # Ampere: A10, A40, RTX 30xx, RTX A6000
    "8.7   1  11.4  -     -"    # Ampere (Tegra): Jetson AGX Orin / Orin Nano
    "8.9   0  11.8  -     -"    # Ada Lovelace: L4, L40(S), RTX 40xx
    "9.0   0  11.8  -     a"    # Hopper: H100, H200, GH200
    "10.0  0  12.8  -     af"   # Blackwell datacenter: B200, GB200
    "10.1  0  12.8  13.0  a"    # Blackwell: Thor under CUDA 12.x (renamed 11.0 in CUDA 13)
    "10.3  0  12.9  -     af"   # Blackwell Ultra datacenter: B300, GB300
    "11.0  1  13.0  -     af"   # Blackwell (Tegra): Jetson Thor (CUDA 13 name)
    "12.0  0  12.8  -     af"   # Blackwell consumer/workstation: RTX 50xx, RTX PRO 6000
    "12.1  0  12.9  -     af"   # Blackwell: DGX Spark (GB10)
    PARENT_SCOPE)
endfunction()

# First nvcc that accepts each suffix (on archs that have it at all).
function(_aphrodite_cuda_suffix_table out_var)
  set(${out_var}
    "a  12.0"   # arch-specific feature set (sm_90a first)
    "f  12.9"   # family-portable feature set
    PARENT_SCOPE)
endfunction()

# Known HIP (ROCm) archs, in output order.
function(_aphrodite_hip_arch_table out_var)
  set(${out_var}
    gfx906    # CDNA-ish Vega 20: MI50 / MI60
    gfx908    # CDNA 1: MI100
    gfx90a    # CDNA 2: MI210 / MI250(X)
    gfx942    # CDNA 3: MI300X / MI300A / MI325X
    gfx950    # CDNA 4: MI350X / MI355X
    gfx1030   # RDNA 2: RX 6800/6900, Radeon PRO W6800
    gfx1100   # RDNA 3: RX 7900 XTX/XT, Radeon PRO W7900
    gfx1101   # RDNA 3: RX 7800/7700, Radeon PRO W7700
    gfx1200   # RDNA 4: RX 9060
    gfx1201   # RDNA 4: RX 9070 (XT), Radeon AI PRO R9700
    PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------------------
# Private helpers
# ---------------------------------------------------------------------------

# cmake_parse_arguments(PARSE_ARGV) escapes `;` inside one argument; undo that
# so quoted and unquoted list arguments look the same.
macro(_aphrodite_flatten var)
  string(REPLACE "\\;" ";" ${var} "${${var}}")
endmacro()

# Split a string on spaces, tabs, newlines and `;` into a list of tokens.
function(_aphrodite_tokenize out_var str)
  string(REGEX MATCHALL "[^ \t\r\n;]+" _tokens "${str}")
  set(${out_var} "${_tokens}" PARENT_SCOPE)
endfunction()

# Look up a plain version in the CUDA table.  Sets <prefix>_FOUND (TRUE/FALSE),
# <prefix>_JETSON (0/1), <prefix>_MIN, <prefix>_MAX ("-" = none) and
# <prefix>_SUFFIXES ("" / "a" / "af").
function(_aphrodite_cuda_arch_info version prefix)
  _aphrodite_cuda_arch_table(_table)
  set(_found FALSE)
  set(_jetson 0)
  set(_min "")
  set(_max "")
  set(_suffixes "")
  foreach(_row IN LISTS _table)
    if(_row MATCHES "^([0-9.]+) +([01]) +([0-9.]+) +([0-9.]+|-) +([a-z]+|-)$")
      if(CMAKE_MATCH_1 STREQUAL version)
        set(_found TRUE)
        set(_jetson "${CMAKE_MATCH_2}")
        set(_min "${CMAKE_MATCH_3}")
        set(_max "${CMAKE_MATCH_4}")
        set(_suffixes "${CMAKE_MATCH_5}")
        if(_suffixes STREQUAL "-")
          set(_suffixes "")
        endif()
        break()
      endif()
    else()
      message(FATAL_ERROR "archs.cmake: malformed CUDA arch table row '${_row}'")
    endif()
  endforeach()
  set(${prefix}_FOUND "${_found}" PARENT_SCOPE)
  set(${prefix}_JETSON "${_jetson}" PARENT_SCOPE)
  set(${prefix}_MIN "${_min}" PARENT_SCOPE)
  set(${prefix}_MAX "${_max}" PARENT_SCOPE)
  set(${prefix}_SUFFIXES "${_suffixes}" PARENT_SCOPE)
endfunction()

# All table versions (plain), optionally only those carrying <suffix>.
function(_aphrodite_cuda_known_versions out_var)
  set(_want_suffix "")
  if(ARGC GREATER 1)
    set(_want_suffix "${ARGV1}")
  endif()
  _aphrodite_cuda_arch_table(_table)
  set(_out "")
  foreach(_row IN LISTS _table)
    if(_row MATCHES "^([0-9.]+) +[01] +[0-9.]+ +[0-9.-]+ +([a-z]+|-)$")
      set(_version "${CMAKE_MATCH_1}")
      string(FIND "${CMAKE_MATCH_2}" "${_want_suffix}" _pos)
      if(_want_suffix STREQUAL "" OR _pos GREATER_EQUAL 0)
        list(APPEND _out "${_version}")
      endif()
    endif()
  endforeach()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

# First nvcc version accepting <suffix> ("" -> "0").
function(_aphrodite_cuda_suffix_min out_var suffix)
  set(_min "0")
  if(NOT suffix STREQUAL "")
    _aphrodite_cuda_suffix_table(_table)
    foreach(_row IN LISTS _table)
      if(_row MATCHES "^([a-z]) +([0-9.]+)$")
        if(CMAKE_MATCH_1 STREQUAL suffix)
          set(_min "${CMAKE_MATCH_2}")
        endif()
      endif()
    endforeach()
  endif()
  set(${out_var} "${_min}" PARENT_SCOPE)
endfunction()

# Split a normalised arch ("9.0a+PTX") into <prefix>_VERSION (9.0),
# <prefix>_MAJOR (9), <prefix>_MINOR (0), <prefix>_SUFFIX (a),
# <prefix>_PTX (1) and <prefix>_BASE (9.0a).
function(_aphrodite_cuda_arch_split arch prefix)
  if(NOT arch MATCHES "^(([0-9]+)\\.([0-9]+))([af]?)(\\+PTX)?$")
    message(FATAL_ERROR
      "'${arch}' is not a normalised CUDA arch (expected MAJOR.MINOR, then "
      "optionally `a` or `f`, then optionally `+PTX`, e.g. 9.0a or 12.0+PTX). "
      "Pass the list through aphrodite_parse_cuda_archs() first.")
  endif()
  set(${prefix}_VERSION "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${prefix}_MAJOR "${CMAKE_MATCH_2}" PARENT_SCOPE)
  set(${prefix}_MINOR "${CMAKE_MATCH_3}" PARENT_SCOPE)
  set(${prefix}_SUFFIX "${CMAKE_MATCH_4}" PARENT_SCOPE)
  set(${prefix}_BASE "${CMAKE_MATCH_1}${CMAKE_MATCH_4}" PARENT_SCOPE)
  if(CMAKE_MATCH_5)
    set(${prefix}_PTX 1 PARENT_SCOPE)
  else()
    set(${prefix}_PTX 0 PARENT_SCOPE)
  endif()
endfunction()

# Rank of a suffix in the sort order: plain < a < f.
function(_aphrodite_cuda_suffix_rank out_var suffix)
  if(suffix STREQUAL "a")
    set(${out_var} 1 PARENT_SCOPE)
  elseif(suffix STREQUAL "f")
    set(${out_var} 2 PARENT_SCOPE)
  else()
    set(${out_var} 0 PARENT_SCOPE)
  endif()
endfunction()

# Fixed-width sort key for an arch: version, then suffix rank.
function(_aphrodite_cuda_arch_key out_var arch)
  _aphrodite_cuda_arch_split("${arch}" _a)
  _aphrodite_cuda_suffix_rank(_rank "${_a_SUFFIX}")
  math(EXPR _key "100000000 + ${_a_MAJOR} * 10000 + ${_a_MINOR} * 10 + ${_rank}")
  set(${out_var} "${_key}" PARENT_SCOPE)
endfunction()

# Sort, deduplicate and merge X.Y / X.Y+PTX of already-valid archs.
function(_aphrodite_cuda_archs_normalize out_var)
  set(_keyed "")
  set(_ptx_bases "")
  foreach(_arch IN LISTS ARGN)
    _aphrodite_cuda_arch_split("${_arch}" _a)
    _aphrodite_cuda_arch_key(_key "${_arch}")
    list(APPEND _keyed "${_key}|${_a_BASE}")
    if(_a_PTX)
      list(APPEND _ptx_bases "${_a_BASE}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _keyed)
  list(SORT _keyed)
  set(_out "")
  foreach(_entry IN LISTS _keyed)
    string(REGEX REPLACE "^[0-9]+\\|" "" _base "${_entry}")
    if("${_base}" IN_LIST _ptx_bases)
      list(APPEND _out "${_base}+PTX")
    else()
      list(APPEND _out "${_base}")
    endif()
  endforeach()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

# Whether nvcc <nvcc_version> can compile <arch> (normalised); sets <out_var>
# to TRUE/FALSE.
function(_aphrodite_cuda_arch_buildable out_var arch nvcc_version)
  _aphrodite_cuda_arch_split("${arch}" _a)
  _aphrodite_cuda_arch_info("${_a_VERSION}" _i)
  set(_ok FALSE)
  if(_i_FOUND AND NOT nvcc_version VERSION_LESS _i_MIN)
    set(_ok TRUE)
    if(NOT _i_MAX STREQUAL "-" AND NOT nvcc_version VERSION_LESS _i_MAX)
      set(_ok FALSE)
    endif()
    _aphrodite_cuda_suffix_min(_smin "${_a_SUFFIX}")
    if(nvcc_version VERSION_LESS _smin)
      set(_ok FALSE)
    endif()
  endif()
  set(${out_var} "${_ok}" PARENT_SCOPE)
endfunction()

function(_aphrodite_check_nvcc_version nvcc_version)
  if(NOT nvcc_version MATCHES "^[0-9]+\\.[0-9]+(\\.[0-9]+)*$")
    message(FATAL_ERROR
      "nvcc version '${nvcc_version}' is not a version number; expected "
      "something like 12.8 or 13.0 (CMAKE_CUDA_COMPILER_VERSION).")
  endif()
endfunction()

# ---------------------------------------------------------------------------
# CUDA: parsing and toolkit checks
# ---------------------------------------------------------------------------

function(aphrodite_parse_cuda_archs out_var)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "TOOLKIT_VERSION;SOURCE" "")
  set(_str "${_arg_UNPARSED_ARGUMENTS}")
  _aphrodite_flatten(_str)
  if(_arg_SOURCE)
    set(_where "${_arg_SOURCE} ('${_str}')")
  else()
    set(_where "CUDA arch list '${_str}'")
  endif()
  _aphrodite_cuda_known_versions(_known)
  list(JOIN _known " " _known_str)
  _aphrodite_tokenize(_tokens "${_str}")
  if(_tokens STREQUAL "")
    message(FATAL_ERROR
      "${_where} is empty. List at least one CUDA arch, e.g. \"8.0 9.0\"; "
      "known archs: ${_known_str}.")
  endif()

  set(_archs "")
  foreach(_tok IN LISTS _tokens)
    if(_tok MATCHES "^[Ss][Mm]_|^[Cc][Oo][Mm][Pp][Uu][Tt][Ee]_")
      set(_hint "MAJOR.MINOR")
      if(_tok MATCHES "^[A-Za-z]+_([0-9]+)([0-9])([af]?)$")
        set(_hint "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
      endif()
      message(FATAL_ERROR
        "${_where}: '${_tok}' is an nvcc arch name, but this list takes "
        "MAJOR.MINOR versions; write '${_hint}' instead.")
    endif()
    if(_tok MATCHES "\\(|\\)")
      set(_hint "MAJOR.MINOR")
      if(_tok MATCHES "^([0-9]+\\.[0-9]+[af]?)\\(")
        set(_hint "${CMAKE_MATCH_1}")
      endif()
      message(FATAL_ERROR
        "${_where}: '${_tok}' looks like PyTorch's rewritten form "
        "(arch(compat-arch)); write just '${_hint}' instead.")
    endif()
    if(_tok MATCHES "(\\+[Pp][Tt][Xx])(\\+[Pp][Tt][Xx])+$")
      string(REGEX REPLACE "(\\+[Pp][Tt][Xx])+$" "+PTX" _hint "${_tok}")
      message(FATAL_ERROR
        "${_where}: '${_tok}' repeats +PTX; +PTX may appear once per arch, "
        "write '${_hint}'.")
    endif()
    if(NOT _tok MATCHES "^([0-9]+\\.[0-9]+)([A-Za-z]?)(\\+[Pp][Tt][Xx])?$")
      message(FATAL_ERROR
        "${_where}: '${_tok}' is not a CUDA arch; expected MAJOR.MINOR, "
        "optionally followed by `a` or `f` and/or `+PTX` (e.g. 8.6, 9.0a, "
        "12.0+PTX). Known archs: ${_known_str}.")
    endif()
    set(_version "${CMAKE_MATCH_1}")
    set(_suffix "${CMAKE_MATCH_2}")
    set(_ptx "")
    if(CMAKE_MATCH_3)
      set(_ptx "+PTX")
    endif()
    _aphrodite_cuda_arch_info("${_version}" _i)
    if(NOT _i_FOUND)
      message(FATAL_ERROR
        "${_where}: '${_tok}' is not a CUDA arch; write one of the known "
        "archs: ${_known_str}.")
    endif()
    if(NOT _suffix STREQUAL "")
      if(NOT _suffix MATCHES "^[af]$")
        message(FATAL_ERROR
          "${_where}: '${_tok}' has suffix '${_suffix}'; the only arch "
          "suffixes are `a` (arch-specific) and `f` (family), in lower case.")
      endif()
      string(FIND "${_i_SUFFIXES}" "${_suffix}" _pos)
      if(_pos LESS 0)
        _aphrodite_cuda_known_versions(_with "${_suffix}")
        list(JOIN _with " " _with_str)
        message(FATAL_ERROR
          "${_where}: '${_tok}' is not valid: CUDA arch ${_version} has no "
          "`${_suffix}` variant. Write '${_version}${_ptx}', or pick an arch "
          "that has it: ${_with_str}.")
      endif()
    endif()
    list(APPEND _archs "${_version}${_suffix}${_ptx}")
  endforeach()

  _aphrodite_cuda_archs_normalize(_archs ${_archs})
  if(DEFINED _arg_TOOLKIT_VERSION)
    aphrodite_check_cuda_archs_for_toolkit("${_archs}" "${_arg_TOOLKIT_VERSION}")
  endif()
  set(${out_var} "${_archs}" PARENT_SCOPE)
endfunction()

function(aphrodite_cuda_archs_for_toolkit out_var nvcc_version)
  _aphrodite_check_nvcc_version("${nvcc_version}")
  _aphrodite_cuda_known_versions(_known)
  set(_out "")
  foreach(_v IN LISTS _known)
    _aphrodite_cuda_arch_buildable(_ok "${_v}" "${nvcc_version}")
    if(_ok)
      list(APPEND _out "${_v}")
    endif()
  endforeach()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

function(aphrodite_check_cuda_archs_for_toolkit)
  set(_args "${ARGV}")
  _aphrodite_flatten(_args)
  list(LENGTH _args _n)
  if(_n LESS 1)
    message(FATAL_ERROR
      "aphrodite_check_cuda_archs_for_toolkit(<archs> <nvcc_version>) needs "
      "an nvcc version.")
  endif()
  list(POP_BACK _args _nvcc)
  _aphrodite_check_nvcc_version("${_nvcc}")
  set(_bad "")
  foreach(_arch IN LISTS _args)
    _aphrodite_cuda_arch_buildable(_ok "${_arch}" "${_nvcc}")
    if(NOT _ok)
      list(APPEND _bad "${_arch}")
    endif()
  endforeach()
  if(_bad)
    aphrodite_cuda_archs_for_toolkit(_can "${_nvcc}")
    list(JOIN _bad " " _bad_str)
    list(JOIN _can " " _can_str)
    set(_sfx "")
    foreach(_s IN ITEMS a f)
      _aphrodite_cuda_suffix_min(_smin "${_s}")
      if(NOT _nvcc VERSION_LESS _smin)
        string(APPEND _sfx " `${_s}`")
      endif()
    endforeach()
    if(_sfx STREQUAL "")
      set(_sfx " none")
    endif()
    message(FATAL_ERROR
      "nvcc ${_nvcc} cannot compile CUDA arch(s) ${_bad_str}. Remove them from "
      "the arch list or use a different CUDA toolkit. nvcc ${_nvcc} can build: "
      "${_can_str} (suffixes it accepts:${_sfx}).")
  endif()
endfunction()

# ---------------------------------------------------------------------------
# CUDA: intersection, flags, defaults
# ---------------------------------------------------------------------------

function(aphrodite_cuda_archs_intersect out_var)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "" "SUPPORTED;REQUESTED")
  if(_arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
      "aphrodite_cuda_archs_intersect: unexpected arguments "
      "'${_arg_UNPARSED_ARGUMENTS}'; usage: "
      "aphrodite_cuda_archs_intersect(<out_var> SUPPORTED <archs> REQUESTED <archs>).")
  endif()
  set(_supported "${_arg_SUPPORTED}")
  set(_requested "${_arg_REQUESTED}")
  _aphrodite_flatten(_supported)
  _aphrodite_flatten(_requested)

  # Pre-split the supported list once.
  set(_n 0)
  foreach(_s IN LISTS _supported)
    _aphrodite_cuda_arch_split("${_s}" _sp)
    _aphrodite_cuda_arch_info("${_sp_VERSION}" _si)
    _aphrodite_cuda_suffix_rank(_srank "${_sp_SUFFIX}")
    foreach(_f IN ITEMS VERSION MAJOR MINOR SUFFIX PTX BASE)
      set(_s${_n}_${_f} "${_sp_${_f}}")
    endforeach()
    set(_s${_n}_JETSON "${_si_JETSON}")
    set(_s${_n}_RANK "${_srank}")
    math(EXPR _n "${_n} + 1")
  endforeach()

  set(_out "")
  foreach(_r IN LISTS _requested)
    _aphrodite_cuda_arch_split("${_r}" _r)
    # Same-major search.
    set(_best_score -1)
    set(_best_emit "")
    if(_n GREATER 0)
      math(EXPR _last "${_n} - 1")
      foreach(_i RANGE ${_last})
        if(NOT _s${_i}_MAJOR EQUAL _r_MAJOR)
          continue()
        endif()
        if(_s${_i}_VERSION VERSION_GREATER _r_VERSION)
          continue()
        endif()
        if(_s${_i}_JETSON AND NOT _s${_i}_VERSION VERSION_EQUAL _r_VERSION)
          continue()
        endif()
        set(_emit "")
        if(_s${_i}_SUFFIX STREQUAL "")
          set(_emit "${_s${_i}_VERSION}")
          if(_r_SUFFIX STREQUAL "a" AND _s${_i}_VERSION VERSION_EQUAL _r_VERSION)
            set(_emit "${_r_BASE}")
          endif()
        elseif(_s${_i}_SUFFIX STREQUAL "a")
          if(_r_SUFFIX STREQUAL "a" AND _s${_i}_VERSION VERSION_EQUAL _r_VERSION)
            set(_emit "${_s${_i}_BASE}")
          endif()
        else() # f: version <= R within the major, already checked
          set(_emit "${_s${_i}_BASE}")
        endif()
        if(_emit STREQUAL "")
          continue()
        endif()
        if(_s${_i}_SUFFIX STREQUAL _r_SUFFIX)
          set(_tie 3)
        else()
          set(_tie "${_s${_i}_RANK}")
        endif()
        math(EXPR _score "${_s${_i}_MINOR} * 10 + ${_tie}")
        if(_score GREATER _best_score)
          set(_best_score "${_score}")
          set(_best_emit "${_emit}")
        endif()
      endforeach()
    endif()
    if(NOT _best_emit STREQUAL "")
      if(_r_PTX)
        string(APPEND _best_emit "+PTX")
      endif()
      list(APPEND _out "${_best_emit}")
      continue()
    endif()

    # Cross-major search: PTX of a lower-major plain arch, if R or S asks
    # for PTX.  Arch-specific (a) and family (f) PTX does not run on other
    # majors, so only plain S qualify.
    set(_best_key "")
    set(_best_emit "")
    if(_n GREATER 0)
      foreach(_i RANGE ${_last})
        if(NOT _s${_i}_MAJOR LESS _r_MAJOR)
          continue()
        endif()
        if(NOT _s${_i}_SUFFIX STREQUAL "" OR _s${_i}_JETSON)
          continue()
        endif()
        if(NOT _r_PTX AND NOT _s${_i}_PTX)
          continue()
        endif()
        _aphrodite_cuda_arch_key(_key "${_s${_i}_BASE}")
        if(_best_key STREQUAL "" OR _key GREATER _best_key)
          set(_best_key "${_key}")
          set(_best_emit "${_s${_i}_BASE}+PTX")
        endif()
      endforeach()
    endif()
    if(NOT _best_emit STREQUAL "")
      list(APPEND _out "${_best_emit}")
    endif()
  endforeach()

  _aphrodite_cuda_archs_normalize(_out ${_out})
  _aphrodite_cuda_archs_fold_hopper(_out ${_out})
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

# The archs without plain 9.0 where 9.0a (or 9.0a+PTX) is among them. Hopper's 9.0a code runs
# on every GPU that plain 9.0 code runs on (there is no other 9.x GPU): with both ("9.0 9.0a")
# every file would be compiled twice, and which cubin an H100 loads would be the driver's
# choice. 9.0+PTX stays for its PTX. Not so for the other `a` archs: plain 10.0 / 12.0 code
# also runs on 10.3 / 12.1 GPUs (and is emitted for them), their `a` code does not.
function(_aphrodite_cuda_archs_fold_hopper out_var)
  set(_archs ${ARGN})
  if("9.0" IN_LIST _archs AND ("9.0a" IN_LIST _archs OR "9.0a+PTX" IN_LIST _archs))
    list(REMOVE_ITEM _archs "9.0")
  endif()
  set(${out_var} "${_archs}" PARENT_SCOPE)
endfunction()

function(aphrodite_cuda_gencode_flags out_var)
  set(_archs "${ARGN}")
  _aphrodite_flatten(_archs)
  set(_flags "")
  foreach(_arch IN LISTS _archs)
    _aphrodite_cuda_arch_split("${_arch}" _a)
    set(_num "${_a_MAJOR}${_a_MINOR}${_a_SUFFIX}")
    list(APPEND _flags "-gencode=arch=compute_${_num},code=sm_${_num}")
    if(_a_PTX)
      list(APPEND _flags "-gencode=arch=compute_${_num},code=compute_${_num}")
    endif()
  endforeach()
  set(${out_var} "${_flags}" PARENT_SCOPE)
endfunction()

function(aphrodite_default_cuda_archs out_var nvcc_version)
  _aphrodite_check_nvcc_version("${nvcc_version}")
  # Release default: SASS for the GPUs people actually deploy on -- Turing T4,
  # Ampere A100 and A10/RTX 30xx, Ada L4/L40/RTX 40xx, Hopper H100/H200,
  # Blackwell B200 and RTX 50xx -- and PTX for the newest of them, so a GPU
  # newer than this list can still JIT the kernels.  Jetson archs, pre-Turing
  # archs and the `a`/`f` variants are opt-in via TORCH_CUDA_ARCH_LIST.
  # An older nvcc that cannot build an entry just drops it; +PTX then moves
  # to the newest entry left so forward compatibility is kept.
  set(_default 7.5 8.0 8.6 8.9 9.0 10.0 12.0)
  set(_out "")
  foreach(_v IN LISTS _default)
    _aphrodite_cuda_arch_buildable(_ok "${_v}" "${nvcc_version}")
    if(_ok)
      list(APPEND _out "${_v}")
    endif()
  endforeach()
  if(_out)
    list(POP_BACK _out _newest)
    list(APPEND _out "${_newest}+PTX")
  endif()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------------------
# HIP
# ---------------------------------------------------------------------------

function(aphrodite_parse_hip_archs out_var)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "SOURCE" "")
  set(_str "${_arg_UNPARSED_ARGUMENTS}")
  _aphrodite_flatten(_str)
  if(_arg_SOURCE)
    set(_where "${_arg_SOURCE} ('${_str}')")
  else()
    set(_where "HIP arch list '${_str}'")
  endif()
  _aphrodite_hip_arch_table(_known)
  list(JOIN _known " " _known_str)
  _aphrodite_tokenize(_tokens "${_str}")
  if(_tokens STREQUAL "")
    message(FATAL_ERROR
      "${_where} is empty. List at least one gfx arch, e.g. \"gfx942\"; "
      "known archs: ${_known_str}.")
  endif()
  foreach(_tok IN LISTS _tokens)
    if(_tok IN_LIST _known)
      continue()
    endif()
    if(_tok MATCHES "^(gfx[0-9a-f]+):")
      message(FATAL_ERROR
        "${_where}: '${_tok}' carries target features; write just "
        "'${CMAKE_MATCH_1}' (features such as xnack/sramecc are not selected "
        "through this list).")
    endif()
    string(TOLOWER "${_tok}" _lower)
    if(_lower IN_LIST _known)
      message(FATAL_ERROR
        "${_where}: '${_tok}' must be written in lower case: '${_lower}'.")
    endif()
    message(FATAL_ERROR
      "${_where}: '${_tok}' is not a known HIP arch; expected a gfx name, "
      "one of: ${_known_str}.")
  endforeach()
  set(_out "")
  foreach(_k IN LISTS _known)
    if(_k IN_LIST _tokens)
      list(APPEND _out "${_k}")
    endif()
  endforeach()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

function(aphrodite_hip_archs_intersect out_var)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "" "SUPPORTED;REQUESTED")
  if(_arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR
      "aphrodite_hip_archs_intersect: unexpected arguments "
      "'${_arg_UNPARSED_ARGUMENTS}'; usage: "
      "aphrodite_hip_archs_intersect(<out_var> SUPPORTED <archs> REQUESTED <archs>).")
  endif()
  set(_supported "${_arg_SUPPORTED}")
  set(_requested "${_arg_REQUESTED}")
  _aphrodite_flatten(_supported)
  _aphrodite_flatten(_requested)
  _aphrodite_hip_arch_table(_known)
  set(_out "")
  foreach(_k IN LISTS _known)
    if(_k IN_LIST _supported AND _k IN_LIST _requested)
      list(APPEND _out "${_k}")
    endif()
  endforeach()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

function(aphrodite_hip_offload_flags out_var)
  set(_archs "${ARGN}")
  _aphrodite_flatten(_archs)
  set(_flags "")
  foreach(_arch IN LISTS _archs)
    list(APPEND _flags "--offload-arch=${_arch}")
  endforeach()
  set(${out_var} "${_flags}" PARENT_SCOPE)
endfunction()
