# Every external dependency is found the CMake way; a missing one stops the
# configure step with the Debian package that provides it.
find_package(PkgConfig)
if(NOT PkgConfig_FOUND)
  message(FATAL_ERROR "pkg-config not found: apt-get install pkg-config")
endif()

# cxltier_find_package(<Name> <debian-package> [find_package args...])
macro(cxltier_find_package name debian)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "${name} not found: apt-get install ${debian}")
  endif()
endmacro()

# cxltier_pkg_check(<PREFIX> <pkg-config module> <debian-package>) -> PkgConfig::<PREFIX>
macro(cxltier_pkg_check prefix module debian)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${module})
  if(NOT ${prefix}_FOUND)
    message(FATAL_ERROR "${module} (pkg-config) not found: apt-get install ${debian}")
  endif()
endmacro()

cxltier_pkg_check(XXHASH libxxhash libxxhash-dev)
cxltier_find_package(CLI11 libcli11-dev CONFIG)
cxltier_find_package(nlohmann_json nlohmann-json3-dev 3.10 CONFIG)
cxltier_find_package(fmt libfmt-dev CONFIG)
find_package(Threads REQUIRED)

if(BUILD_TESTING OR NOT DEFINED BUILD_TESTING)
  cxltier_find_package(GTest libgtest-dev CONFIG)
endif()
cxltier_find_package(benchmark libbenchmark-dev CONFIG)
