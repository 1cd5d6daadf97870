# Precompiled headers. Most translation units include Boost.Asio (through
# daemon/server), nlohmann/json and much of the standard library, and the
# tests GoogleTest too: parsed once per build instead of once per file
# (their parse took 4 to 6 s of a file's compile; with the PCH a file took
# 1.5 to 3 s less, 2026-12-07, this VM; docs/testing.md has the build's
# times). Two headers, one for code and one for tests, each built
# once by an object library and reused by every target that calls
# cxltier_use_pch (REUSE_FROM: the same compile options, as here, where the
# options are set for the whole tree).
#
# Left out: the engine (it must see only pure headers, cmake/EnginePurity.cmake),
# position-independent targets (the client library, proto, the Python
# module: a PCH holds one code model), and headers whose users configure
# them with macros before including them (xxhash.h with XXH_INLINE_ALL) or
# whose CMake targets add definitions (spdlog, fmt): a PCH fixes the macros
# it was built with. For that reason the PCH targets link nothing but GTest (for the
# test PCH, whose users all link it): every header here is in /usr/include.
option(CXLTIER_PCH "Precompiled headers (faster builds)" ON)

# Boost's CMake target defines BOOST_ALL_NO_LIB (it turns off MSVC's automatic
# linking: nothing on Linux), so a PCH built without it is refused by the
# targets that link Boost and one built with it by those that do not. Defined
# for every target, it is one PCH for all.
add_compile_definitions(BOOST_ALL_NO_LIB)

set(CXLTIER_PCH_HEADERS
    <algorithm> <array> <atomic> <chrono> <cstdint> <cstring> <filesystem> <fstream>
    <functional> <map> <memory> <mutex> <optional> <set> <span> <sstream> <string>
    <string_view> <thread> <unordered_map> <utility> <vector>
    <boost/asio.hpp> <nlohmann/json.hpp>)

# Test targets compile at -O1 with line tables only (-g1; the sanitizer builds
# use -g1 too) in the default build: tests spend their time in the daemon's
# code and in waits, not in their own, and -O2 -g took a test file 40% longer
# to compile (tests/integration/daemon_test.cpp: 22 against 13 s). A failing
# test's backtrace needs only files and lines.
set(CXLTIER_TEST_FLAGS $<$<CONFIG:RelWithDebInfo>:-O1> $<$<CONFIG:RelWithDebInfo,Debug>:-g1>)

if(CXLTIER_PCH)
  add_library(cxltier_pch OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch/pch.cpp)
  target_precompile_headers(cxltier_pch PRIVATE ${CXLTIER_PCH_HEADERS})
endif()
if(CXLTIER_PCH AND TARGET GTest::gtest)
  add_library(cxltier_pch_test OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch/pch.cpp)
  # GTest::gtest for the options it gives its users (GTEST_HAS_PTHREAD=1).
  target_link_libraries(cxltier_pch_test PRIVATE GTest::gtest)
  target_compile_options(cxltier_pch_test PRIVATE ${CXLTIER_TEST_FLAGS})
  target_precompile_headers(cxltier_pch_test PRIVATE ${CXLTIER_PCH_HEADERS} <gtest/gtest.h>)
endif()

# cxltier_use_pch(<target> [TEST])
function(cxltier_use_pch target)
  cmake_parse_arguments(PARSE_ARGV 1 P "TEST" "" "")
  if(CXLTIER_PCH)
    if(P_TEST)
      target_precompile_headers(${target} REUSE_FROM cxltier_pch_test)
    else()
      target_precompile_headers(${target} REUSE_FROM cxltier_pch)
    endif()
  endif()
endfunction()
