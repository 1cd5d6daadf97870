# Runs cmake/Layering.cmake on a copy of the source tree's C++ files with
# broken rules (includes across layers, a file in no layer, an impure engine)
# and on target lists with broken links and sources, and expects it to fail
# with one line per break naming its file:line (or target) and rule. The clean
# copy and target lists must pass, so each failure is the break's doing; a few
# crossings the rules allow must not be named.
#   cmake -DCHECKER=... -DSOURCE_DIR=... -DWORK=... [-DTARGET_INFO=<the build's>] -P selftest.cmake
cmake_minimum_required(VERSION 3.25)
set(failures "")

include(${CMAKE_CURRENT_LIST_DIR}/../checker_selftest.cmake)

file(REMOVE_RECURSE "${WORK}")
# A copy of the tree's C++ files (every folder the table names).
function(tree_copy dir)
  foreach(top include proto trace client daemon tools python tests)
    file(COPY "${SOURCE_DIR}/${top}" DESTINATION "${dir}" FILES_MATCHING
         PATTERN "*.h" PATTERN "*.hpp" PATTERN "*.c" PATTERN "*.cc" PATTERN "*.cpp"
         PATTERN "*.inc" PATTERN "*.ipp" PATTERN "*.tcc")
  endforeach()
endfunction()

# A tree with every break at once: the checker must fail with exactly one line
# per break, each naming its file:line, include and rule (so no break hides
# behind another, and the crossings the rules allow add nothing).
# breaks(NAME WHERE LINE WANT): LINE as line 2 of a new file in the folder WHERE
# (ending in /), or appended to the existing file WHERE; the output must name
# `FILE:<line>: LINE: reaches` and WANT. allows(NAME WHERE LINE): the same, but
# the file must not be named.
set(broken "${WORK}/broken")
set(cases "")
set(allowed "")
function(put where line name out_file out_at)
  if(where MATCHES "/$")
    set(file "${where}stray_${name}.cpp")
    file(WRITE "${broken}/${file}" "// a stray file\n${line}\n")
    set(at 2)
  else()
    set(file "${where}")
    file(READ "${broken}/${file}" text)
    string(REGEX MATCHALL "\n" newlines "${text}")
    list(LENGTH newlines at)
    math(EXPR at "${at} + 1")
    file(APPEND "${broken}/${file}" "${line}\n")
  endif()
  set(${out_file} "${file}" PARENT_SCOPE)
  set(${out_at} ${at} PARENT_SCOPE)
endfunction()
function(breaks name where line want)
  put("${where}" "${line}" ${name} file at)
  set(cases ${cases} ${name} PARENT_SCOPE)
  set(want_${name} "${file}:${at}: ${line}: reaches" "${want}" PARENT_SCOPE)
endfunction()
function(allows name where line)
  put("${where}" "${line}" ${name} file at)
  set(allowed ${allowed} ${name} PARENT_SCOPE)
  set(file_${name} "${file}" PARENT_SCOPE)
endfunction()

tree_copy("${WORK}/clean")
check(clean_copy_passes TRUE "" -DSOURCE_DIR=${WORK}/clean)
tree_copy("${broken}")

set(service_rule "daemon/service may use only include, proto, trace, daemon/engine, daemon/numa, daemon/server")
# The daemon, proto, client and trace do not reach tools/ (by a path, or by a name
# that only an include directory of the tools would find).
breaks(service_includes_tools_by_path daemon/service/ "#include \"../../tools/sim/simulate.h\""
       "reaches tools/sim/simulate.h (tools/sim), but ${service_rule}")
breaks(service_includes_tools_by_name daemon/service/ "#include \"simulate.h\""
       "reaches tools/sim/simulate.h (tools/sim), but ${service_rule}")
breaks(service_header_includes_tools daemon/service/daemon.h
       "#include \"../../tools/loadgen/copy_mode.h\"" "(tools/loadgen), but ${service_rule}")
breaks(daemon_main_includes_tools daemon/ "#include \"../tools/replay/fit.h\""
       "(tools/replay), but daemon may use only")
breaks(proto_includes_tools proto/ "#include \"../tools/cxltierctl/plan.h\""
       "(tools/cxltierctl), but proto may use only include")
breaks(client_includes_tools client/ "#include \"../tools/loadgen/copy_mode.h\""
       "(tools/loadgen), but client may use only include, client-api, proto")
breaks(trace_includes_tests trace/ "#include \"../tests/shell.h\""
       "reaches tests/shell.h (tests), but trace may use only include, proto")
breaks(daemon_includes_python daemon/server/ "#include \"../../python/cxltier_module.cpp\""
       "(python), but daemon/server may use only")
# Upward or sideways in the daemon, and proto or include reaching into it.
breaks(proto_includes_daemon proto/ "#include \"../daemon/server/server.h\""
       "reaches daemon/server/server.h (daemon/server), but proto may use only include")
breaks(proto_includes_daemon_by_name proto/ "#include \"server/segment.h\""
       "reaches daemon/server/segment.h (daemon/server)")
breaks(server_includes_service daemon/server/ "#include \"service/daemon.h\""
       "(daemon/service), but daemon/server may use only include, proto, daemon/numa")
breaks(numa_includes_engine daemon/numa/ "#include \"engine/engine.h\""
       "(daemon/engine), but daemon/numa may use only include")
breaks(angle_include_of_ours daemon/numa/ "#include <server/server.h>"
       "(daemon/server), but daemon/numa may use only include")
breaks(public_header_includes_daemon include/cxltier/segment.h
       "#include \"../../daemon/numa/migrator.h\"" "(daemon/numa), but include may use only nothing")
breaks(public_header_includes_client_api include/cxltier/socket_path.h "#include \"cxltier/client.h\""
       "(client-api), but include may use only nothing")
breaks(service_includes_client_api daemon/service/ "#include \"cxltier/client.h\""
       "reaches include/cxltier/client.h (client-api), but ${service_rule}")
breaks(loadgen_includes_daemon tools/loadgen/ "#include \"service/daemon.h\""
       "(daemon/service), but tools/loadgen may use only")
breaks(python_includes_tools python/ "#include \"../tools/loadgen/copy_mode.h\""
       "(tools/loadgen), but python may use only")
# What the rules allow.
allows(tests_may_use_tools tests/ "#include \"../tools/sim/simulate.h\"")
allows(bench_may_use_service tools/bench/ "#include \"service/daemon.h\"")
allows(service_may_use_trace daemon/service/ "#include \"trace.h\"")
allows(sim_may_use_engine tools/sim/ "#include \"engine/engine.h\"")
allows(system_header daemon/service/ "#include \"fmt/format.h\"")
# A C++ file in a folder with no line in the table; and the engine's own rules.
file(WRITE "${broken}/newdir/stray.cpp" "int x;\n")
set(want_file_in_no_layer "newdir/stray.cpp: in no layer")
file(WRITE "${broken}/daemon/engine/stray.cpp" "#include <chrono>\n")
set(want_engine_impure "daemon/engine/stray.cpp: #include <chrono>: reads the clock")
list(APPEND cases file_in_no_layer engine_impure)

# expect_all(NAME OUTPUT CASES...): each case's wants are in OUTPUT, and OUTPUT
# counts as many problems as there are cases.
function(expect_all name out)
  list(LENGTH ARGN n)
  foreach(c IN LISTS ARGN)
    set(missing "")
    foreach(w IN LISTS want_${c})
      string(FIND "${out}" "${w}" at)
      if(at EQUAL -1)
        set(missing "${w}")
      endif()
    endforeach()
    if(missing STREQUAL "")
      message("ok   ${c}")
    else()
      message("FAIL ${c}: the output does not name '${missing}'")
      set(failures "${failures};${c}")
    endif()
  endforeach()
  string(FIND "${out}" "(${n} problems;" at)
  if(at EQUAL -1)
    message("FAIL ${name}: expected ${n} problems, one per break:\n${out}")
    set(failures "${failures};${name}")
  else()
    message("ok   ${name}: ${n} problems, one per break")
  endif()
  set(failures "${failures}" PARENT_SCOPE)
endfunction()
execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${broken} -P ${CHECKER}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message("FAIL include_breaks: the broken tree passed:\n${out}")
  list(APPEND failures include_breaks)
endif()
expect_all(include_breaks "${out}" ${cases})
foreach(c IN LISTS allowed)
  string(FIND "${out}" "${file_${c}}" at)
  if(at EQUAL -1)
    message("ok   ${c}")
  else()
    message("FAIL ${c}: ${file_${c}} is allowed, but named:\n${out}")
    list(APPEND failures ${c})
  endif()
endforeach()

# Links and sources, from a target list like the one configure writes.
set(info "${WORK}/targets.cmake")
function(targets_with extra)
  file(WRITE "${info}" "set(CXLTIER_TARGETS cxltier_proto cxltier_trace cxltier cxltier_engine
    cxltier_numa cxltier_server cxltier_service cxltier_sim_lib cxltier-loadgen service_test)
set(T_cxltier_proto_HOME proto)
set(T_cxltier_trace_HOME trace)
set(T_cxltier_trace_LINKS cxltier_proto)
set(T_cxltier_HOME client)
set(T_cxltier_LINKS cxltier_proto)
set(T_cxltier_engine_HOME daemon/engine)
set(T_cxltier_numa_HOME daemon/numa)
set(T_cxltier_server_HOME daemon/server)
set(T_cxltier_server_LINKS cxltier_numa cxltier_proto)
set(T_cxltier_service_HOME daemon/service)
set(T_cxltier_service_SOURCES ${WORK}/clean/daemon/service/daemon.cpp)
set(T_cxltier_service_LINKS cxltier_server cxltier_engine cxltier_numa cxltier_trace)
set(T_cxltier_sim_lib_HOME tools/sim)
set(T_cxltier_sim_lib_LINKS cxltier_trace cxltier_engine cxltier_proto)
set(T_cxltier-loadgen_HOME tools/loadgen)
set(T_cxltier-loadgen_LINKS cxltier cxltier_sim_lib)
set(T_service_test_HOME tests/service)
set(T_service_test_LINKS cxltier_service cxltier_sim_lib)
${extra}
")
endfunction()
set(clean_tree -DSOURCE_DIR=${WORK}/clean -DTARGET_INFO=${info})
targets_with("")
check(clean_targets_pass TRUE "" ${clean_tree})
targets_with("
list(APPEND T_cxltier_service_LINKS cxltier_sim_lib)
list(APPEND T_cxltier_proto_LINKS cxltier_engine)
list(APPEND T_cxltier_LINKS cxltier_server)
list(APPEND T_cxltier_numa_LINKS cxltier_service)
list(APPEND T_cxltier-loadgen_LINKS cxltier_service)
list(APPEND T_cxltier_service_SOURCES ${WORK}/clean/tools/sim/simulate.cpp)")
set(want_service_links_tools
    "target cxltier_service (daemon/service) links cxltier_sim_lib (tools/sim), but ${service_rule}")
set(want_proto_links_engine
    "target cxltier_proto (proto) links cxltier_engine (daemon/engine), but proto may use only include")
set(want_client_links_server "target cxltier (client) links cxltier_server (daemon/server)")
set(want_numa_links_service "target cxltier_numa (daemon/numa) links cxltier_service (daemon/service)")
set(want_loadgen_links_service "target cxltier-loadgen (tools/loadgen) links cxltier_service")
set(want_service_compiles_tools
    "target cxltier_service (daemon/service) compiles tools/sim/simulate.cpp (tools/sim)")
execute_process(COMMAND ${CMAKE_COMMAND} ${clean_tree} -P ${CHECKER}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message("FAIL link_breaks: the broken targets passed:\n${out}")
  list(APPEND failures link_breaks)
endif()
expect_all(link_breaks "${out}" service_links_tools proto_links_engine client_links_server
           numa_links_service loadgen_links_service service_compiles_tools)
# The build's own target list, with one link more.
if(TARGET_INFO)
  check(build_targets_pass TRUE "" -DSOURCE_DIR=${WORK}/clean -DTARGET_INFO=${TARGET_INFO})
  file(READ "${TARGET_INFO}" real)
  file(WRITE "${info}" "${real}\nlist(APPEND T_cxltier_server_LINKS cxltier_replay_lib)\n")
  check(build_targets_server_links_tools FALSE
        "target cxltier_server (daemon/server) links cxltier_replay_lib (tools/replay)" ${clean_tree})
endif()

file(REMOVE_RECURSE "${WORK}")
if(failures)
  message(FATAL_ERROR "the layering check missed or misreported:${failures}")
endif()
message(STATUS "the layering check fails on every broken rule tried")
