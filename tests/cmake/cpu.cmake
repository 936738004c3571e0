# cpu plugin tests (tests/c/test-cpu-*.c): each links the test driver
# (tests/c/cpu_driver.c, which dlopens lib/libddplug-cpu.so) and the
# plugin's sources as a static archive for white-box checks.
file(GLOB _cpu_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/c/test-cpu-*.c)
foreach(_src IN LISTS _cpu_tests)
  get_filename_component(_name ${_src} NAME_WE)
  target_sources(${_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/c/cpu_data.c)
  # The driver stands in for the runtime (it checks the plugin's declared
  # options with the runtime's own code): not for tests of the public API.
  file(STRINGS ${_src} _shared REGEX "DT_LINK_SHARED")
  if(NOT _shared)
    target_sources(${_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/c/cpu_driver.c)
  endif()
  target_link_libraries(${_name} PRIVATE ddplug_cpu_internal ${CMAKE_DL_LIBS})
  add_dependencies(${_name} ddplug-cpu)
endforeach()

# After every cpu-plugin test: nothing abandoned in /dev/shm.
set(_cpu_test_names)
foreach(_src IN LISTS _cpu_tests)
  get_filename_component(_name ${_src} NAME_WE)
  list(APPEND _cpu_test_names ${_name})
endforeach()
add_test(NAME cpu-no-shm-left-behind COMMAND test-cpu-shm no_segment_left_behind)
set_tests_properties(cpu-no-shm-left-behind PROPERTIES
  ENVIRONMENT "${DDPLUG_TEST_ENV}" DEPENDS "${_cpu_test_names}")

# test-cpu-shm plants stale segments and checks /dev/shm machine-wide, and
# every cpu group_create (of any test) cleans stale segments: alone, so no
# parallel test removes its segment between two of its checks (0.3 s).
set_tests_properties(test-cpu-shm PROPERTIES RUN_SERIAL TRUE)
