# softrdma_tests_build_options(): every target under the source tree that links GoogleTest
# (the test executables and their helper libraries)
# - compiles with line tables only (-g1) instead of full debug information, in a Debug build
#   too (both presets build everything with -g1, CMakePresets.json). A failing test's
#   backtrace (gdb, ASan, UBSan) still names functions, files and lines; only variable
#   inspection in a debugger is lost, for test code alone. Measured on a 2-core machine
#   (transport_test.cpp, -O2): 16.9 s with -g, 11.3 s with -g1; test code is ~40 % of a
#   from-scratch build's compile time, and CI builds two presets from nothing.
# - is never a unity build (CMAKE_UNITY_BUILD, on in both presets): test files gain little
#   from it (gtest's template expansion is per test, not per file: engine_tests 75 -> 63 s
#   under ASan) and their file-local helpers share names across files. The product's
#   libraries and tools are (CMakePresets.json, CMakeLists.txt).
# - in the default preset, compiles at -O1 (the product keeps -O2): 25-35 % less compile
#   time (transport_test.cpp 18-20 -> 13-16 s, api_test.cpp 8-9 -> 5.5-6 s); test code is not
#   what the tests time.
# - in a sanitizer build, compiles at -O0 (the product's code stays at the preset's -O1):
#   instrumented test code compiles 2.6x faster so (transport_test.cpp 40 -> 15 s, api_test.cpp
#   17 -> 7 s) and runs on the product's code, which is where the time goes. Warnings that
#   need the optimiser still see the test code in the default preset (-O1). A target whose
#   test code itself does heavy work sets the property SOFTRDMA_SANITIZE_OPTIMIZED and keeps
#   the preset's -O1 (ccl_verbs_tests).
# GCC and Clang take the last -g level given, and target options follow the build type's
# flags on the command line.
# _softrdma_compiled_targets(DIR OUT): the targets defined in DIR and the directories below
# it that compile sources (not INTERFACE libraries or custom targets), in OUT.
function(_softrdma_compiled_targets dir out)
  set(found "")
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT type STREQUAL "UTILITY")
      list(APPEND found ${t})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d ${subdirs})
    _softrdma_compiled_targets(${d} below)
    list(APPEND found ${below})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Whether target T links GoogleTest (a test executable or a test helper library), in OUT.
function(_softrdma_is_test t out)
  get_target_property(libs ${t} LINK_LIBRARIES)
  if(libs MATCHES "GTest::")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(softrdma_tests_build_options)
  if(NOT SOFTRDMA_TESTS)
    return()
  endif()
  _softrdma_compiled_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t ${targets})
    _softrdma_is_test(${t} is_test)
    if(NOT is_test)
      continue()
    endif()
    target_compile_options(${t} PRIVATE $<$<CONFIG:RelWithDebInfo,Debug>:-g1>)
    set_target_properties(${t} PROPERTIES UNITY_BUILD OFF)
    get_target_property(optimized ${t} SOFTRDMA_SANITIZE_OPTIMIZED)
    if(SOFTRDMA_SANITIZE AND NOT optimized)
      target_compile_options(${t} PRIVATE -O0)
    elseif(NOT SOFTRDMA_SANITIZE)
      target_compile_options(${t} PRIVATE $<$<CONFIG:RelWithDebInfo,Release>:-O1>)
    endif()
  endforeach()
endfunction()

# softrdma_tools_build_options(): in a sanitizer build, the programs under tools/ (softrdma,
# wan_study, kv-bench, kv-demo, the nccl-tests-style *_perf and their helper libraries)
# compile at -O0, as test code does above. Their own code parses arguments, forks peers and
# prints reports; the data paths they drive are the product's libraries, which keep the
# preset's -O1. What makes them expensive is CLI11 2.1 (Debian 12's libcli11-dev, header-only
# with no precompiled mode): one translation unit including <CLI/CLI.hpp> costs ~21 s at -O1
# under ASan and ~8 s at -O0. Measured on a 2-core machine: kv_bench.cpp 33.6 -> 20.4 s;
# the tools took 192 CPU-s of an asan build from nothing. The default preset is unchanged.
function(softrdma_tools_build_options)
  if(NOT SOFTRDMA_SANITIZE)
    return()
  endif()
  _softrdma_compiled_targets(${PROJECT_SOURCE_DIR}/tools targets)
  foreach(t ${targets})
    _softrdma_is_test(${t} is_test)  # test targets: softrdma_tests_build_options()
    if(NOT is_test)
      target_compile_options(${t} PRIVATE -O0)
    endif()
  endforeach()
endfunction()
