# The declarations the Python package reads (CFFI ABI mode): lowbit_cdef.h is
# generated from the public headers by bindings/gen_cdef.py, next to
# liblowbit in the build tree (where the package finds it beside
# LOWBIT_LIBRARY), installed beside the library in the Python package and in
# <prefix>/share/lowbit for the C install. The same run writes the file's
# fingerprint into lowbit_cdef_fingerprint.h, a source of liblowbit
# (lowbit_build_info), so building the library always regenerates the
# declarations, and the package refuses declarations that are not the ones
# the loaded library was built with.
# Needs a Python interpreter and a GCC/Clang-style preprocessor (-E -P); without
# Python the library is built with an empty fingerprint and no declarations.
set(LOWBIT_CDEF_FILE ${PROJECT_BINARY_DIR}/lowbit_cdef.h)
set(_lowbit_fp_header ${LOWBIT_GENERATED_INCLUDE_DIR}/lowbit_cdef_fingerprint.h)
set(_lowbit_public_headers ${PROJECT_SOURCE_DIR}/capi/lowbit.h ${PROJECT_SOURCE_DIR}/capi/lowbit_comm.h)

find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  set(LOWBIT_HAVE_CDEF ON)
  add_custom_command(
    OUTPUT ${LOWBIT_CDEF_FILE} ${_lowbit_fp_header}
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bindings/gen_cdef.py
            --cc ${CMAKE_C_COMPILER}
            -I ${PROJECT_SOURCE_DIR}/capi -I ${LOWBIT_GENERATED_INCLUDE_DIR}
            --out ${LOWBIT_CDEF_FILE} --fingerprint-header ${_lowbit_fp_header}
            ${_lowbit_public_headers}
    DEPENDS ${PROJECT_SOURCE_DIR}/bindings/gen_cdef.py ${_lowbit_public_headers}
            ${LOWBIT_GENERATED_INCLUDE_DIR}/lowbit_version.h
    COMMENT "Generating lowbit_cdef.h (the Python package's declarations) from the public headers"
    VERBATIM)
  message(STATUS "lowbit: Python  declarations (lowbit_cdef.h) generated with ${Python3_EXECUTABLE}")
else()
  set(LOWBIT_HAVE_CDEF OFF)
  file(CONFIGURE OUTPUT ${_lowbit_fp_header} CONTENT "#define LOWBIT_CDEF_FINGERPRINT \"\"\n")
  file(REMOVE ${LOWBIT_CDEF_FILE})
  message(STATUS "lowbit: Python  declarations NOT generated (needs a Python interpreter and GCC or Clang): "
                 "the Python package cannot use this build")
endif()
# One target owns the generation; everything that compiles capi/common_api.cpp
# (liblowbit, the emulated library of tests/cuda) depends on it, so a parallel
# clean build never compiles it before the fingerprint header exists.
add_custom_target(lowbit_cdef DEPENDS ${_lowbit_fp_header} $<$<BOOL:${LOWBIT_HAVE_CDEF}>:${LOWBIT_CDEF_FILE}>)
add_dependencies(lowbit lowbit_cdef)
