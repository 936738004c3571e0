# host plugin tests (tests/c/test-host-*.c): each links the test driver
# (tests/c/host_driver.c, which dlopens lib/libddplug-host.so) and the
# plugin's sources as a static archive for white-box checks.
file(GLOB _host_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/c/test-host-*.c)
foreach(_src IN LISTS _host_tests)
  get_filename_component(_name ${_src} NAME_WE)
  target_sources(${_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/c/host_driver.c
    ${CMAKE_CURRENT_SOURCE_DIR}/c/host_data.c)
  target_link_libraries(${_name} PRIVATE ddplug_host_internal ${CMAKE_DL_LIBS})
  add_dependencies(${_name} ddplug-host)
endforeach()

# After every host test: nothing abandoned in /dev/shm.
set(_host_test_names)
foreach(_src IN LISTS _host_tests)
  get_filename_component(_name ${_src} NAME_WE)
  list(APPEND _host_test_names ${_name})
endforeach()
add_test(NAME host-no-shm-left-behind COMMAND test-host-shm no_segment_left_behind)
set_tests_properties(host-no-shm-left-behind PROPERTIES
  ENVIRONMENT "${DDPLUG_TEST_ENV}" DEPENDS "${_host_test_names}")
