# `cmake --install` to the standard places, and a Debian package with CPack:
# the daemon, the tools, libcxltier with its headers, a pkg-config file and a
# CMake package, the systemd units, sysusers/tmpfiles entries and an example
# configuration.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cxltierd RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})
install(TARGETS cxltierctl cxltier-sim cxltier-loadgen cxltier-load
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS cxltier EXPORT cxltierTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/cxltier DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT cxltierTargets NAMESPACE cxltier::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cxltier)
configure_package_config_file(${CMAKE_SOURCE_DIR}/packaging/cxltierConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cxltierConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cxltier)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cxltierConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cxltierConfig.cmake ${CMAKE_BINARY_DIR}/cxltierConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cxltier)
configure_file(${CMAKE_SOURCE_DIR}/packaging/cxltier.pc.in ${CMAKE_BINARY_DIR}/cxltier.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cxltier.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# systemd: the unit names the installed daemon's path.
set(CXLTIER_UNIT_DIR lib/systemd/system)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/systemd/cxltierd.service)
file(READ ${CMAKE_SOURCE_DIR}/systemd/cxltierd.service CXLTIER_SERVICE)
string(REPLACE "/usr/bin/cxltierd" "${CMAKE_INSTALL_FULL_SBINDIR}/cxltierd" CXLTIER_SERVICE
               "${CXLTIER_SERVICE}")
file(WRITE ${CMAKE_BINARY_DIR}/systemd/cxltierd.service "${CXLTIER_SERVICE}")
install(FILES ${CMAKE_BINARY_DIR}/systemd/cxltierd.service ${CMAKE_SOURCE_DIR}/systemd/cxltierd.socket
        DESTINATION ${CXLTIER_UNIT_DIR})
install(FILES ${CMAKE_SOURCE_DIR}/systemd/cxltier.sysusers DESTINATION lib/sysusers.d
        RENAME cxltier.conf)
install(FILES ${CMAKE_SOURCE_DIR}/systemd/cxltier.tmpfiles DESTINATION lib/tmpfiles.d
        RENAME cxltier.conf)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/cxltierd.toml DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/cxltier)
file(GLOB CXLTIER_DOCS ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${CXLTIER_DOCS} ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cxltier)
set(CPACK_PACKAGE_VENDOR "cxltier")
set(CPACK_PACKAGE_CONTACT "cxltier developers <cxltier@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "keeps the hottest LLM KV-cache blocks in DRAM and the rest in CXL memory")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd")
# The Python module (python/) is built for one python3 minor version and uses numpy.
if(CXLTIER_PYTHON_RECOMMENDS)
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "${CXLTIER_PYTHON_RECOMMENDS}")
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/postinst ${CMAKE_SOURCE_DIR}/packaging/prerm
    ${CMAKE_SOURCE_DIR}/packaging/postrm ${CMAKE_SOURCE_DIR}/packaging/conffiles)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/package)
include(CPack)
