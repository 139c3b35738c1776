# lowbit_scale_test_timeouts(): multiplies the TIMEOUT of every test of the
# calling directory by LOWBIT_TEST_TIMEOUT_SCALE (default 1). The aarch64
# build runs its suites under qemu-user, several times slower than native
# and slower still on a loaded machine: scripts/test_arm.sh sets 4, so a
# suite's timeout stays a few times its duration there too. Call it last in
# each directory that adds tests (set_tests_properties reaches only the
# directory's own tests).
set(LOWBIT_TEST_TIMEOUT_SCALE 1 CACHE STRING "Factor on every test's TIMEOUT (scripts/test_arm.sh: 4 under qemu)")
function(lowbit_scale_test_timeouts)
  if(LOWBIT_TEST_TIMEOUT_SCALE EQUAL 1)
    return()
  endif()
  get_directory_property(tests TESTS)
  foreach(t IN LISTS tests)
    get_test_property(${t} TIMEOUT timeout)
    if(timeout)
      math(EXPR scaled "${timeout} * ${LOWBIT_TEST_TIMEOUT_SCALE}")
      set_tests_properties(${t} PROPERTIES TIMEOUT ${scaled})
    endif()
  endforeach()
endfunction()
