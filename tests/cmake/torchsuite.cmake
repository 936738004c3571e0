# torch's own distributed backend suite (distributed_test.py, in the torch
# wheel) on backend "ddplug" with the cpu plugin, at world sizes 2 and 3
# (tests/torchsuite/run.py: the tests gloo runs on CPU must pass, but for the
# exceptions it lists with their reasons). Needs the project's Python
# (DDPLUG_PYTHON, set by the Makefile) with the pinned expecttest (PY_DEPS).
# Not in sanitizer builds (torch's processes do not load the sanitizer
# runtime).
if(DDPLUG_PYTHON AND NOT DDPLUG_SANITIZE)
  add_test(NAME torch-suite
    COMMAND ${DDPLUG_PYTHON} ${PROJECT_SOURCE_DIR}/tests/torchsuite/run.py
            --world-sizes 2,3 --build ${CMAKE_BINARY_DIR} --out ${CMAKE_BINARY_DIR}/torchsuite)
  set_tests_properties(torch-suite PROPERTIES TIMEOUT 1200 ENVIRONMENT "DDPLUG_LOG=error")
endif()
