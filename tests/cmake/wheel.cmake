# The pip wheel (tests/wheel/test-wheel.sh): built from this checkout,
# installed into a fresh virtual environment with the pinned torch and
# lightning, then `ddplug info` and a 2-rank Trainer.fit from outside the
# checkout with no DDPLUG_* variable. Needs the project's Python
# (DDPLUG_PYTHON, set by the Makefile). Not in sanitizer builds (the wheel
# is an ordinary build). Its CMake build directory and a wheelhouse of the
# pinned packages stay in <build>/wheel between runs.
if(DDPLUG_PYTHON AND NOT DDPLUG_SANITIZE)
  add_test(NAME wheel-install
    COMMAND ${PROJECT_SOURCE_DIR}/tests/wheel/test-wheel.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/wheel ${DDPLUG_PYTHON})
  # The CMake that configured this build, by absolute path: scikit-build-core
  # asks a CMake for its version with a timeout of its own (10 s), and a
  # CMake found on PATH may be a wrapper script (pyenv's shims) slow enough
  # under load to miss it ("Could not find CMake with version >=3.20").
  set_tests_properties(wheel-install PROPERTIES TIMEOUT 900
    ENVIRONMENT "CMAKE_EXECUTABLE=${CMAKE_COMMAND}")
endif()
