# The `ddplug` command: info and run, end to end (tests/cli/test-cli.sh).
add_test(NAME cli-info-run
  COMMAND ${PROJECT_SOURCE_DIR}/tests/cli/test-cli.sh $<TARGET_FILE:ddplug_cmd>
          $<TARGET_FILE:ddplug-c-trainer> ${CMAKE_BINARY_DIR})
set_tests_properties(cli-info-run PROPERTIES ENVIRONMENT "${DDPLUG_TEST_ENV}" TIMEOUT 300)
