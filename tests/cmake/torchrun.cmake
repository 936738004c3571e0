# The C trainer under the real torchrun (tests/torchrun/test-torchrun.sh):
# ddplug's store beside torchrun's agent store. Needs the project's Python
# environment (DDPLUG_PYTHON, set by the Makefile); skipped (77) without it.
if(DDPLUG_PYTHON AND TARGET ddplug-c-trainer)
  add_test(NAME torchrun-c-trainer
    COMMAND ${PROJECT_SOURCE_DIR}/tests/torchrun/test-torchrun.sh ${DDPLUG_PYTHON}
            $<TARGET_FILE:ddplug-c-trainer> ${CMAKE_BINARY_DIR})
  set_tests_properties(torchrun-c-trainer PROPERTIES
    ENVIRONMENT "${DDPLUG_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
