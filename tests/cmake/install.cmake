# The installed package: headers, library, plugins, command, CMake package and
# pkg-config file, used from outside the tree (tests/install/test-install.sh).
# Not in sanitizer builds: the consumer built there is not instrumented.
if(DDPLUG_SANITIZE)
  return()
endif()
add_test(NAME install-package
  COMMAND ${PROJECT_SOURCE_DIR}/tests/install/test-install.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(install-package PROPERTIES TIMEOUT 300)
