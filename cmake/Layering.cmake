# Checks the layering: which folder may include or link which. The rules are
# the table below; one line per broken rule, and a non-zero exit.
#
#   cmake -DSOURCE_DIR=<source tree> [-DTARGET_INFO=<file>] [-DENGINE_TARGET_INFO=<file>]
#         -P cmake/Layering.cmake
#
# Each layer is a folder (or a few files) of the source tree; a file belongs to
# the layer with the longest matching path. A layer may use itself and the
# layers on its USES line, nothing else: the rule is not transitive (the
# daemon's service uses the server, which uses numa; the service may include
# numa only because numa is on its own line too).
# - Includes: every `#include "x"` (and `<x>`, `#include_next`, `#import`) of
#   every C++ file under SOURCE_DIR (.h .hpp .c .cc .cpp .inc .ipp .tcc; build
#   trees, hidden folders and folders without C++ are skipped) is resolved as
#   the compiler would: "x" beside the including file, then on the layer's
#   SEARCH path (the include directories its targets get, as written in the
#   CMakeLists.txt files), then, in case a CMakeLists.txt grew a new include
#   directory, on every layer's SEARCH path; <x> on the layer's SEARCH path
#   only. What resolves to a file of the source tree must be in a layer the
#   including file's layer may use. What does not resolve is a system or
#   third-party header, not ours (daemon/engine's stricter rules are below).
#   A C++ file in no layer is refused: give its folder a line in the table.
# - Links and sources: TARGET_INFO (written at the end of configure by
#   tests/layering/CMakeLists.txt) lists every target of the build, the folder
#   of its first source (a target belongs to that layer: tools/CMakeLists.txt
#   defines every tool), its other sources, and the project targets it links
#   (LINK_LIBRARIES and INTERFACE_LINK_LIBRARIES, aliases resolved, imported
#   and system libraries left out). Each linked target and each source must be
#   in a layer the target's layer may use.
# - daemon/engine's purity (cmake/EnginePurity.cmake: only pure standard
#   headers, links nothing) is checked too when SOURCE_DIR has daemon/engine,
#   with ENGINE_TARGET_INFO if given; it keeps its own ctest, engine_purity.
# tests/layering/ proves the check fails on a broken include, link and source.
cmake_minimum_required(VERSION 3.25)

set(kLayers "")
# layer(NAME PATHS paths... [USES layers...] [SEARCH dirs...]): a line of the table.
# USES ALL: every layer. Paths and SEARCH dirs are relative to SOURCE_DIR.
function(layer name)
  cmake_parse_arguments(PARSE_ARGV 1 L "" "" "PATHS;USES;SEARCH")
  set(kLayers ${kLayers} ${name} PARENT_SCOPE)
  set(kPaths_${name} ${L_PATHS} PARENT_SCOPE)
  set(kUses_${name} ${L_USES} PARENT_SCOPE)
  set(kSearch_${name} ${L_SEARCH} PARENT_SCOPE)
endfunction()

# The rules: each layer's USES line is what it may include and link (besides
# itself); PATHS are its files and folders, SEARCH its include directories.
# `include` is the public headers; `client-api` is the part of them that the
# client library implements (its C++ API and C ABI): the daemon, proto and
# trace must not need it.
layer(include          USES
      PATHS include                                      SEARCH include)
layer(client-api       USES include
      PATHS include/cxltier/client.h include/cxltier/cxltier.h  SEARCH include)
layer(proto            USES include
      PATHS proto                                        SEARCH include)
layer(trace            USES include proto
      PATHS trace                                        SEARCH trace include)
layer(client           USES include client-api proto
      PATHS client                                       SEARCH include)
# The daemon, bottom up: the engine is pure (EnginePurity.cmake says more),
# numa talks to the kernel, the server to the sockets, the service wires them,
# and daemon/main.cpp (cxltierd) wires it all.
layer(daemon/engine    USES include
      PATHS daemon/engine                                SEARCH include daemon)
layer(daemon/numa      USES include
      PATHS daemon/numa                                  SEARCH daemon include)
layer(daemon/server    USES include proto daemon/numa
      PATHS daemon/server                                SEARCH daemon include)
layer(daemon/service   USES include proto trace daemon/engine daemon/numa daemon/server
      PATHS daemon/service                               SEARCH daemon include trace)
layer(daemon           USES include proto trace daemon/engine daemon/numa daemon/server
                            daemon/service
      PATHS daemon                                       SEARCH daemon include trace)
# The tools use the libraries. Only the simulator (the engine) and the bench
# (the whole daemon) reach into the daemon; the tools that replay the
# simulator's workloads use tools/sim. A new tool folder gets `tools`' line.
layer(tools/sim        USES include proto trace daemon/engine
      PATHS tools/sim                                    SEARCH tools/sim trace include daemon)
layer(tools/bench      USES include client-api proto trace client daemon/engine daemon/numa
                            daemon/server daemon/service tools/sim
      PATHS tools/bench                                  SEARCH tools/sim trace include daemon)
layer(tools/loadgen    USES include client-api proto trace client tools/sim
      PATHS tools/loadgen                                SEARCH tools/sim trace include daemon)
layer(tools/replay     USES include client-api proto trace client tools/sim
      PATHS tools/replay                   SEARCH tools/replay tools/sim trace include daemon)
layer(tools/cxltierctl USES include client-api proto client
      PATHS tools/cxltierctl                             SEARCH tools/cxltierctl include)
layer(tools            USES include client-api proto trace client
      PATHS tools                                        SEARCH include)
# The Python module is a client.
layer(python           USES include client-api proto client
      PATHS python                                       SEARCH python include)
# The precompiled headers' own file (cmake/Pch.cmake): system headers only.
layer(cmake/pch        USES
      PATHS cmake/pch                                    SEARCH include)
# Tests and their helpers may use anything.
layer(tests            USES ALL
      PATHS tests
      SEARCH tests include daemon trace tools/sim tools/cxltierctl tools/replay)

foreach(l IN LISTS kLayers)  # a typo in the table must not pass for a rule
  foreach(u IN LISTS kUses_${l})
    if(NOT u IN_LIST kLayers AND NOT u STREQUAL "ALL")
      message(FATAL_ERROR "Layering.cmake: layer ${l} uses '${u}', which is no layer of the table")
    endif()
  endforeach()
endforeach()

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "Layering.cmake: give -DSOURCE_DIR")
endif()
file(REAL_PATH "${SOURCE_DIR}" SOURCE_DIR)

set(violations "")
macro(violation)
  string(CONCAT _violation ${ARGV})
  list(APPEND violations "${_violation}")
endmacro()

# Which layer holds REL (a path relative to SOURCE_DIR): the longest matching path.
foreach(l IN LISTS kLayers)
  foreach(p IN LISTS kPaths_${l})
    set(kLayerAt_${p} ${l})
  endforeach()
endforeach()
function(layer_of rel out)
  while(NOT rel STREQUAL "")
    if(DEFINED kLayerAt_${rel})
      set(${out} "${kLayerAt_${rel}}" PARENT_SCOPE)
      return()
    endif()
    get_filename_component(rel "${rel}" DIRECTORY)
  endwhile()
  set(${out} "" PARENT_SCOPE)
endfunction()

# May layer FROM use layer TO? Sets OUT, and RULE to the rule's text.
function(may_use from to out)
  if(from STREQUAL to OR "ALL" IN_LIST kUses_${from} OR to IN_LIST kUses_${from})
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
  list(JOIN kUses_${from} ", " uses)
  if(uses STREQUAL "")
    set(uses "nothing")
  endif()
  set(rule "${from} may use only ${uses}" PARENT_SCOPE)
endfunction()

# PATH (absolute, real) relative to SOURCE_DIR, or empty if outside it.
function(relative path out)
  string(LENGTH "${SOURCE_DIR}/" n)
  string(SUBSTRING "${path}" 0 ${n} head)
  if(head STREQUAL "${SOURCE_DIR}/")
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${path}")
    set(${out} "${rel}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# The line number of the directive LINE in FILE: its Nth occurrence, N-1 being
# how often SEEN (the directives before it, LINE included) holds it already.
# Only computed for a violation: reading every file whole would be slow.
function(line_of file line seen out)
  set(count 0)
  foreach(l IN LISTS seen)
    if(l STREQUAL line)
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
  file(READ "${file}" content)
  set(offset 0)
  foreach(i RANGE 1 ${count})
    string(SUBSTRING "${content}" ${offset} -1 rest)
    string(FIND "${rest}" "${line}" at)
    if(at EQUAL -1)
      set(${out} "?" PARENT_SCOPE)
      return()
    endif()
    math(EXPR offset "${offset} + ${at} + 1")
  endforeach()
  math(EXPR offset "${offset} - 1")
  string(SUBSTRING "${content}" 0 ${offset} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines n)
  math(EXPR n "${n} + 1")
  set(${out} ${n} PARENT_SCOPE)
endfunction()

# Every include directory of any layer: the last resort for "x".
set(all_search "")
foreach(l IN LISTS kLayers)
  list(APPEND all_search ${kSearch_${l}})
endforeach()
list(REMOVE_DUPLICATES all_search)

# The C++ files: every folder of the source tree but build trees and hidden ones.
set(files "")
file(GLOB tops LIST_DIRECTORIES true RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/*")
foreach(top IN LISTS tops)
  if(top MATCHES "^(\\.|build)" OR EXISTS "${SOURCE_DIR}/${top}/CMakeCache.txt")
    continue()
  endif()
  if(IS_DIRECTORY "${SOURCE_DIR}/${top}")
    file(GLOB_RECURSE found LIST_DIRECTORIES false RELATIVE "${SOURCE_DIR}"
         "${SOURCE_DIR}/${top}/*.h" "${SOURCE_DIR}/${top}/*.hpp" "${SOURCE_DIR}/${top}/*.c"
         "${SOURCE_DIR}/${top}/*.cc" "${SOURCE_DIR}/${top}/*.cpp" "${SOURCE_DIR}/${top}/*.inc"
         "${SOURCE_DIR}/${top}/*.ipp" "${SOURCE_DIR}/${top}/*.tcc")
  elseif(top MATCHES "\\.(h|hpp|c|cc|cpp|inc|ipp|tcc)$")
    set(found "${top}")
  else()
    continue()
  endif()
  list(APPEND files ${found})
endforeach()

set(n_includes 0)
foreach(rel IN LISTS files)
  layer_of("${rel}" from)
  if(from STREQUAL "")
    violation("${rel}: in no layer of cmake/Layering.cmake (give its folder a line in the table)")
    continue()
  endif()
  set(file "${SOURCE_DIR}/${rel}")
  get_filename_component(here "${file}" DIRECTORY)
  # Only directive lines: C++ lines hold ';', which would split a CMake list.
  file(STRINGS "${file}" directives REGEX "^[ \t]*#[ \t]*(include|include_next|import)")
  if(NOT directives)
    continue()
  endif()
  set(seen "")  # the directives met so far, for the line number of a repeated one
  foreach(line IN LISTS directives)
    if(line MATCHES "^[ \t]*#[ \t]*(include|include_next|import)[ \t]*\"([^\"]+)\"")
      set(h "${CMAKE_MATCH_2}")
      set(shown "\"${h}\"")
      set(roots "${here}")
      foreach(d IN LISTS kSearch_${from} all_search)
        list(APPEND roots "${SOURCE_DIR}/${d}")
      endforeach()
    elseif(line MATCHES "^[ \t]*#[ \t]*(include|include_next|import)[ \t]*<([^>]+)>")
      set(h "${CMAKE_MATCH_2}")
      set(shown "<${h}>")
      set(roots "")
      foreach(d IN LISTS kSearch_${from})
        list(APPEND roots "${SOURCE_DIR}/${d}")
      endforeach()
    else()
      continue()  # a computed include: the compiler's business (the engine's check refuses it)
    endif()
    math(EXPR n_includes "${n_includes} + 1")
    list(APPEND seen "${line}")
    set(target_rel "")
    foreach(root IN LISTS roots)
      if(EXISTS "${root}/${h}" AND NOT IS_DIRECTORY "${root}/${h}")
        file(REAL_PATH "${root}/${h}" found)
        relative("${found}" target_rel)
        if(target_rel STREQUAL "")
          set(target_rel "-")  # ours by its path, but a symlink out of the tree
        endif()
        break()
      endif()
    endforeach()
    if(target_rel STREQUAL "" OR target_rel STREQUAL "-")
      continue()  # a system or third-party header
    endif()
    layer_of("${target_rel}" to)
    if(to STREQUAL "")
      line_of("${file}" "${line}" "${seen}" lineno)
      violation("${rel}:${lineno}: #include ${shown}: ${target_rel} is in no layer")
      continue()
    endif()
    may_use("${from}" "${to}" ok)
    if(NOT ok)
      line_of("${file}" "${line}" "${seen}" lineno)
      violation("${rel}:${lineno}: #include ${shown}: reaches ${target_rel} (${to}), but ${rule}")
    endif()
  endforeach()
endforeach()

# Targets: what each links and compiles.
set(CXLTIER_TARGETS "")
set(n_targets 0)
if(TARGET_INFO)
  include("${TARGET_INFO}")
  list(LENGTH CXLTIER_TARGETS n_targets)
  if(n_targets EQUAL 0)
    violation("${TARGET_INFO}: no targets recorded")
  endif()
endif()
foreach(t IN LISTS CXLTIER_TARGETS)
  set(home_rel "${T_${t}_HOME}")
  layer_of("${home_rel}" from)
  if(from STREQUAL "")
    violation("target ${t}: defined in ${home_rel}, which is in no layer")
    continue()
  endif()
  foreach(lib IN LISTS T_${t}_LINKS)
    if(NOT lib IN_LIST CXLTIER_TARGETS)
      violation("target ${t} (${from}) links '${lib}', which is not a target of this build")
      continue()
    endif()
    layer_of("${T_${lib}_HOME}" to)
    may_use("${from}" "${to}" ok)
    if(NOT ok)
      violation("target ${t} (${from}) links ${lib} (${to}), but ${rule}")
    endif()
  endforeach()
  foreach(src IN LISTS T_${t}_SOURCES)
    if(EXISTS "${src}")
      file(REAL_PATH "${src}" src)
    endif()
    relative("${src}" src_rel)
    if(src_rel STREQUAL "")
      continue()  # generated in the build tree
    endif()
    layer_of("${src_rel}" to)
    if(to STREQUAL "")
      violation("target ${t} (${from}) compiles ${src_rel}, which is in no layer")
      continue()
    endif()
    may_use("${from}" "${to}" ok)
    if(NOT ok)
      violation("target ${t} (${from}) compiles ${src_rel} (${to}), but ${rule}")
    endif()
  endforeach()
endforeach()

# daemon/engine's own, stricter rules.
set(engine_note "")
if(EXISTS "${SOURCE_DIR}/daemon/engine")
  set(args -DENGINE_DIR=${SOURCE_DIR}/daemon/engine -DINCLUDE_ROOT=${SOURCE_DIR}/include
           -DDAEMON_DIR=${SOURCE_DIR}/daemon)
  if(ENGINE_TARGET_INFO)
    list(APPEND args -DTARGET_INFO=${ENGINE_TARGET_INFO})
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} ${args} -P ${CMAKE_CURRENT_LIST_DIR}/EnginePurity.cmake
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(STRIP "${out}" out)
    violation("cmake/EnginePurity.cmake failed:\n${out}")
  endif()
  set(engine_note ", daemon/engine pure")
endif()

list(LENGTH files n_files)
if(violations)
  list(LENGTH violations n)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "the layering is broken (${n} problems; the rules are in cmake/Layering.cmake):\n  ${text}")
endif()
message(STATUS "the layering holds: ${n_includes} includes in ${n_files} files, "
               "${n_targets} targets${engine_note}")
