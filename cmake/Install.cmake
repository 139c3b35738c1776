include(CMakePackageConfigHelpers)

install(TARGETS lowbit EXPORT lowbitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES capi/lowbit.h capi/lowbit_comm.h ${LOWBIT_GENERATED_INCLUDE_DIR}/lowbit_version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(LOWBIT_HAVE_CDEF)
  # For the Python package pointed at this install (LOWBIT_LIBRARY=<prefix>/lib/liblowbit.so).
  install(FILES ${LOWBIT_CDEF_FILE} DESTINATION ${CMAKE_INSTALL_DATADIR}/lowbit)
endif()
install(EXPORT lowbitTargets NAMESPACE lowbit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)

configure_package_config_file(cmake/lowbitConfig.cmake.in ${PROJECT_BINARY_DIR}/lowbitConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lowbitConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lowbitConfig.cmake ${PROJECT_BINARY_DIR}/lowbitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)

# Relocatable: the prefix is found relative to the .pc file.
file(RELATIVE_PATH LOWBIT_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(cmake/lowbit.pc.in ${PROJECT_BINARY_DIR}/lowbit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/lowbit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
