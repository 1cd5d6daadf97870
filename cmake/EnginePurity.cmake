# Checks that daemon/engine is pure: no syscalls, clock, I/O, logging or threads
# can reach it through an include, and the engine target links nothing.
# Include paths cannot enforce this (<numa.h> and <boost/...> sit in
# /usr/include, and the engine's own include path also reaches daemon/numa/),
# so this script reads every #include of the engine and of the project headers
# it pulls in.
#
#   cmake -DENGINE_DIR=<daemon/engine> -DINCLUDE_ROOT=<include> [-DDAEMON_DIR=<daemon>]
#         [-DTARGET_INFO=<file>] [-DLINK_LIBRARIES=<a|b>] [-DSOURCES=<a|b>] [-DSTAMP=<file>]
#         -P cmake/EnginePurity.cmake
#
# Rules, for every file under ENGINE_DIR (.h .hpp .cpp .cc .inc .ipp .tcc):
# - `#include <x>`: x must be a C++ standard library header on the list below.
#   Clock, thread, I/O, environment and OS-random headers are not on it.
# - `#include "x"`: x must resolve (beside the including file, then under
#   INCLUDE_ROOT, then under DAEMON_DIR, as the compiler would) to a file in
#   ENGINE_DIR or INCLUDE_ROOT/cxltier/, and a header from include/cxltier/
#   must follow the same rules itself (checked recursively). The client
#   library's headers (client.h, cxltier.h, detail/) are refused.
# - a computed include (`#include MACRO`) is refused: it cannot be checked.
# TARGET_INFO (written at the end of configure, see daemon/engine/CMakeLists.txt)
# sets ENGINE_LINK_LIBRARIES, ENGINE_INTERFACE_LINK_LIBRARIES and ENGINE_SOURCES;
# LINK_LIBRARIES and SOURCES ('|'-separated) do the same from the command line
# (the self-test uses them). The engine may link nothing at all (the C++ runtime
# comes with the compiler), and its sources must all lie in ENGINE_DIR.
# Exits non-zero with one line per violation; touches STAMP when clean.
cmake_minimum_required(VERSION 3.25)

# Pure C++ standard library headers. To add one, say why it cannot reach the OS.
set(kAllowed
    algorithm any array bit bitset cassert cctype cfloat charconv cinttypes climits cmath
    compare complex concepts cstddef cstdint cstring deque exception expected forward_list
    functional initializer_list iterator limits list map memory memory_resource new numbers
    numeric optional queue ranges ratio set source_location span stack stdexcept string
    string_view system_error tuple type_traits typeindex typeinfo unordered_map unordered_set
    utility valarray variant vector version)
# Third-party headers that only compute over memory. xxhash.h: the keyed hash
# of block keys (engine/keyed_hash.h), inlined (XXH_INLINE_ALL), so the engine
# still links nothing; it calls only XXH3_64bits_withSeed.
list(APPEND kAllowed xxhash.h)
# Standard headers that are refused, with the reason given in the error.
set(kWhy_chrono "reads the clock")
set(kWhy_ctime "reads the clock")
foreach(h thread mutex shared_mutex condition_variable future semaphore latch barrier stop_token
          atomic)
  set(kWhy_${h} "threads and synchronisation belong to the daemon (the engine runs on its caller's thread)")
endforeach()
foreach(h iostream istream ostream fstream sstream iomanip ios iosfwd streambuf cstdio print
          syncstream spanstream strstream filesystem format)
  set(kWhy_${h} "does I/O or formatting for output (the engine returns values, callers log)")
endforeach()
foreach(h cstdlib csignal csetjmp cerrno locale clocale)
  set(kWhy_${h} "reaches the process environment or the OS")
endforeach()
set(kWhy_random "std::random_device reads the OS (take a seed or a generator from the caller)")

if(NOT ENGINE_DIR OR NOT INCLUDE_ROOT)
  message(FATAL_ERROR "EnginePurity.cmake: give -DENGINE_DIR and -DINCLUDE_ROOT")
endif()
file(REAL_PATH "${ENGINE_DIR}" ENGINE_DIR)
file(REAL_PATH "${INCLUDE_ROOT}" INCLUDE_ROOT)
if(NOT DAEMON_DIR)
  get_filename_component(DAEMON_DIR "${ENGINE_DIR}" DIRECTORY)
endif()
file(REAL_PATH "${DAEMON_DIR}" DAEMON_DIR)
set(kPublic "${INCLUDE_ROOT}/cxltier")
# Public headers that declare no pure code: the client library talks to a daemon.
set(kPublicRefused "${kPublic}/client.h" "${kPublic}/cxltier.h" "${kPublic}/detail/fd_passing.h")

set(violations "")
macro(violation)
  string(CONCAT _violation ${ARGV})
  list(APPEND violations "${_violation}")
endmacro()

# PATH is under DIR (both real paths)?
function(is_under path dir out)
  string(LENGTH "${dir}/" n)
  string(SUBSTRING "${path}" 0 ${n} head)
  if(head STREQUAL "${dir}/")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(display path out)  # relative to the source tree (the include root's parent) if in it
  get_filename_component(base "${INCLUDE_ROOT}" DIRECTORY)
  is_under("${path}" "${base}" inside)
  if(inside)
    file(RELATIVE_PATH path "${base}" "${path}")
  endif()
  set(${out} "${path}" PARENT_SCOPE)
endfunction()

set(checked "")
set(queue "")
file(GLOB_RECURSE engine_files LIST_DIRECTORIES false
     "${ENGINE_DIR}/*.h" "${ENGINE_DIR}/*.hpp" "${ENGINE_DIR}/*.cpp" "${ENGINE_DIR}/*.cc"
     "${ENGINE_DIR}/*.inc" "${ENGINE_DIR}/*.ipp" "${ENGINE_DIR}/*.tcc")
if(NOT engine_files)
  violation("${ENGINE_DIR}: no engine sources found")
endif()
foreach(f IN LISTS engine_files)
  file(REAL_PATH "${f}" f)
  list(APPEND queue "${f}")
endforeach()

while(queue)
  list(POP_FRONT queue file)
  if(file IN_LIST checked)
    continue()
  endif()
  list(APPEND checked "${file}")
  display("${file}" shown)
  get_filename_component(here "${file}" DIRECTORY)
  # Only directive lines: C++ lines hold ';', which would split a CMake list.
  file(STRINGS "${file}" directives REGEX "^[ \t]*#[ \t]*(include|include_next|import)")
  foreach(line IN LISTS directives)
    if(line MATCHES "^[ \t]*#[ \t]*(include|include_next|import)[ \t]*<([^>]+)>")
      set(h "${CMAKE_MATCH_2}")
      if(h IN_LIST kAllowed)
        continue()
      endif()
      if(EXISTS "${INCLUDE_ROOT}/${h}")  # <cxltier/...>: a project header, checked like "..."
        file(REAL_PATH "${INCLUDE_ROOT}/${h}" found)
        is_under("${found}" "${kPublic}" in_public)
        if(in_public AND NOT found IN_LIST kPublicRefused)
          list(APPEND queue "${found}")
          continue()
        endif()
      endif()
      if(DEFINED kWhy_${h})
        violation("${shown}: #include <${h}>: ${kWhy_${h}}")
      else()
        violation("${shown}: #include <${h}>: not a pure C++ standard library header "
                  "(OS, C library and third-party headers belong in daemon/numa, server or service)")
      endif()
    elseif(line MATCHES "^[ \t]*#[ \t]*(include|include_next|import)[ \t]*\"([^\"]+)\"")
      set(h "${CMAKE_MATCH_2}")
      set(found "")
      foreach(root IN ITEMS "${here}" "${INCLUDE_ROOT}" "${DAEMON_DIR}")
        if(EXISTS "${root}/${h}" AND NOT IS_DIRECTORY "${root}/${h}")
          file(REAL_PATH "${root}/${h}" found)
          break()
        endif()
      endforeach()
      if(NOT found)
        violation("${shown}: #include \"${h}\": found neither in the engine nor in include/cxltier/")
        continue()
      endif()
      is_under("${found}" "${ENGINE_DIR}" in_engine)
      is_under("${found}" "${kPublic}" in_public)
      if(found IN_LIST kPublicRefused)
        violation("${shown}: #include \"${h}\": the client library's API (sockets, fds), not pure code")
      elseif(in_engine OR in_public)
        list(APPEND queue "${found}")  # its own includes must be pure too
      else()
        display("${found}" where)
        violation("${shown}: #include \"${h}\": ${where} is outside daemon/engine and include/cxltier")
      endif()
    else()
      string(STRIP "${line}" line)
      violation("${shown}: '${line}': a computed include cannot be checked")
    endif()
  endforeach()
endwhile()

# What the engine target links and compiles.
if(TARGET_INFO)
  include("${TARGET_INFO}")
endif()
if(DEFINED LINK_LIBRARIES)
  string(REPLACE "|" ";" ENGINE_LINK_LIBRARIES "${LINK_LIBRARIES}")
endif()
if(DEFINED SOURCES)
  string(REPLACE "|" ";" ENGINE_SOURCES "${SOURCES}")
endif()
foreach(lib IN LISTS ENGINE_LINK_LIBRARIES ENGINE_INTERFACE_LINK_LIBRARIES)
  # '::@(dir)' and '::@' mark a link made from another directory; the item between is the link.
  if(NOT lib STREQUAL "" AND NOT lib MATCHES "^::@")
    violation("cxltier_engine links '${lib}': the engine links nothing but the C++ runtime")
  endif()
endforeach()
foreach(src IN LISTS ENGINE_SOURCES)
  if(IS_ABSOLUTE "${src}")
    set(path "${src}")
  else()
    set(path "${ENGINE_DIR}/${src}")
  endif()
  cmake_path(NORMAL_PATH path)  # '..' must not pass for inside
  if(EXISTS "${path}")
    file(REAL_PATH "${path}" path)
  endif()
  is_under("${path}" "${ENGINE_DIR}" in_engine)
  if(NOT in_engine)
    violation("cxltier_engine compiles '${src}', which is outside daemon/engine")
  endif()
endforeach()

list(LENGTH checked n_checked)
if(violations)
  list(LENGTH violations n)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "daemon/engine is not pure (${n} problems in ${n_checked} files):\n  ${text}")
endif()
message(STATUS "daemon/engine is pure: ${n_checked} files, only standard headers, links nothing")
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
