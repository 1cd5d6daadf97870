# Runs cmake/EnginePurity.cmake on copies of daemon/engine (and include/) with
# one impurity each and expects it to fail naming that impurity; the clean
# copies must pass, so each failure is the impurity's doing.
#   cmake -DCHECKER=... -DENGINE_DIR=... -DINCLUDE_ROOT=... -DDAEMON_DIR=... -DWORK=... -P selftest.cmake
cmake_minimum_required(VERSION 3.25)
set(failures "")

include(${CMAKE_CURRENT_LIST_DIR}/../checker_selftest.cmake)

file(REMOVE_RECURSE "${WORK}")
set(clean_include "${WORK}/include")
file(COPY "${INCLUDE_ROOT}/cxltier" DESTINATION "${clean_include}")

# A copy of the daemon's tree as the engine sees it: DIR/engine (the engine's
# files include each other as "engine/x.h") and DIR/numa (an impure layer to
# reach for); with LINE in a new engine source, or appended to engine.h.
function(daemon_copy dir)
  file(COPY "${ENGINE_DIR}/" DESTINATION "${dir}/engine")
  file(COPY "${DAEMON_DIR}/numa/" DESTINATION "${dir}/numa")
endfunction()
function(engine_with dir line where)
  daemon_copy("${dir}")
  if(where STREQUAL "new")
    file(WRITE "${dir}/engine/stray.cpp" "// an engine source\n${line}\nint Stray() { return 0; }\n")
  else()
    file(APPEND "${dir}/engine/engine.h" "${line}\n")
  endif()
endfunction()

set(clean -DENGINE_DIR=${WORK}/clean/engine -DDAEMON_DIR=${WORK}/clean)
set(base -DINCLUDE_ROOT=${clean_include})
daemon_copy("${WORK}/clean")
check(clean_copy_passes TRUE "" ${clean} ${base} -DSOURCES=engine.cpp|policies.cpp)

set(n 0)
foreach(case IN ITEMS "numa.h|#include <numa.h>" "boost|#include <boost/asio.hpp>"
                      "migrator|#include \"numa/migrator.h\"" "unistd|#  include <unistd.h>"
                      "chrono|#include <chrono>" "iostream|#include <iostream>"
                      "client_api|#include \"cxltier/client.h\"" "computed|#include CXLTIER_HEADER"
                      "missing|#include \"no_such_header.h\"")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts 1 line)
  string(REGEX REPLACE "^#[ ]*include " "" want "${line}")
  foreach(where new header)
    math(EXPR n "${n} + 1")
    engine_with("${WORK}/case${n}" "${line}" ${where})
    check("${name}_in_${where}_file" FALSE "${want}" -DENGINE_DIR=${WORK}/case${n}/engine
          -DDAEMON_DIR=${WORK}/case${n} ${base})
  endforeach()
endforeach()

# An impure public header that the engine includes fails too (the check follows includes).
file(COPY "${INCLUDE_ROOT}/cxltier" DESTINATION "${WORK}/bad_include")
file(APPEND "${WORK}/bad_include/cxltier/block.h" "#include <sys/mman.h>\n")
check(impure_public_header FALSE "cxltier/block.h: #include <sys/mman.h>"
      ${clean} -DINCLUDE_ROOT=${WORK}/bad_include)

# Links and sources: the engine links nothing and compiles only its own files.
check(links_numa FALSE "links 'numa'" ${clean} ${base} -DLINK_LIBRARIES=numa)
check(links_boost FALSE "links 'Boost::headers'" ${clean} ${base}
      "-DLINK_LIBRARIES=fmt::fmt|Boost::headers")
check(foreign_source FALSE "'../numa/migrator.cpp', which is outside" ${clean} ${base} "-DSOURCES=engine.cpp|../numa/migrator.cpp")
file(WRITE "${WORK}/target_info.cmake"
     "set(ENGINE_LINK_LIBRARIES [==[]==])\nset(ENGINE_INTERFACE_LINK_LIBRARIES [==[PkgConfig::NUMA]==])\n")
check(interface_link_from_target_info FALSE "links 'PkgConfig::NUMA'" ${clean} ${base} -DTARGET_INFO=${WORK}/target_info.cmake)

file(REMOVE_RECURSE "${WORK}")
if(failures)
  message(FATAL_ERROR "the engine purity check missed or misreported:${failures}")
endif()
message(STATUS "the engine purity check fails on every impurity tried")
