# softrdma_no_leak_checks(TEST...): in a sanitizer build (SOFTRDMA_SANITIZE), the named tests
# run with LeakSanitizer off (ASAN_OPTIONS=detect_leaks=0:abort_on_error=1). For tests whose
# third-party programs (Open MPI, UCX, libfabric, the Python interpreter) leave their own
# allocations at exit, which LeakSanitizer would turn into a failing exit status: memory
# errors are still checked, and softrdma's libraries are leak-checked by the C++ tests.
# The shell tests' counterpart is scripts/lib/test_lib.sh's no_leak_checks_under_asan.
function(softrdma_no_leak_checks)
  if(SOFTRDMA_SANITIZE)
    set_tests_properties(${ARGN} PROPERTIES ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
  endif()
endfunction()
