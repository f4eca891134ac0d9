# cmake -DTEST_BINARY=<plexus_tests> -P check_test_names.cmake
# Fails if a test name holds '[', ']' or ';' (ctest's lists split or glue such names) or starts
# with '-' (the test binary reads it as an option).
execute_process(COMMAND ${TEST_BINARY} --list-test-names-only
  OUTPUT_VARIABLE names RESULT_VARIABLE rc)
# Catch2 v2 exits with the number of tests listed, v3 with 0; a crash gives a message instead.
if(NOT rc MATCHES "^[0-9]+$" OR names STREQUAL "")
  message(FATAL_ERROR "${TEST_BINARY} --list-test-names-only failed (${rc})")
endif()
string(REGEX MATCH "[^\n]*[][;][^\n]*" bad "${names}")
if(bad)
  message(FATAL_ERROR "test name \"${bad}\" contains [, ] or ;")
endif()
string(REGEX MATCH "(^|\n)-[^\n]*" bad "${names}")
if(bad)
  string(STRIP "${bad}" bad)
  message(FATAL_ERROR "test name \"${bad}\" starts with -")
endif()
string(REGEX MATCHALL "\n" lines "${names}")
list(LENGTH lines count)
message(STATUS "${count} test names checked")
