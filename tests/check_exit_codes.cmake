# Runs the hidden [exit-code] tests of TEST_BINARY one at a time and checks the exit code each
# gives ctest: 0 for a pass, 77 (SKIP_RETURN_CODE) for a skip, and for a failure anything but 0
# and 77, however many checks failed (tests/support/main.cpp).
set(cases
  "exit code: a test that passes=pass"
  "exit code: a test that skips=skip"
  "exit code: a test with 1 failed check=fail"
  "exit code: a test with 4 failed checks=fail"
  "exit code: a test with 77 failed checks=fail"
  "exit code: a test that fails a check and then skips=fail")
set(bad "")
foreach(c IN LISTS cases)
  string(REGEX MATCH "^(.*)=([a-z]+)$" _ "${c}")
  set(name "${CMAKE_MATCH_1}")
  set(want "${CMAKE_MATCH_2}")
  execute_process(COMMAND ${TEST_BINARY} "${name}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(want STREQUAL "pass" AND NOT (rc EQUAL 0 AND out MATCHES "in 1 test case"))
    # A name that matches no test exits 0 under Catch2 v2: the pass must have run one.
    string(APPEND bad "\n  '${name}': exit ${rc}, want 0 after running 1 test case")
  elseif(want STREQUAL "skip" AND NOT rc EQUAL 77)
    string(APPEND bad "\n  '${name}': exit ${rc}, want 77")
  elseif(want STREQUAL "fail" AND (rc EQUAL 0 OR rc EQUAL 77 OR NOT rc MATCHES "^[0-9]+$"))
    string(APPEND bad "\n  '${name}': exit ${rc}, want a failure other than 77")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "exit codes ctest would misread:${bad}")
endif()
list(LENGTH cases n)
message(STATUS "${n} exit codes as ctest must read them")
