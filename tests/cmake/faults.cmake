# The fault-injection suite (tests/faults/faults.py): real processes, real
# sockets, network namespaces where root allows. Two helper programs: a rank
# (fault-rank) and an external store that reports every stage of joining
# (fault-store). ctest runs each group of scenarios once (lean); the soak
# mode is for by hand, outside CI:
#   tests/faults/faults.py --build build --soak --trials 20
add_executable(fault-rank ${CMAKE_CURRENT_SOURCE_DIR}/faults/fault_rank.c)
target_link_libraries(fault-rank PRIVATE ddplug)
target_compile_options(fault-rank PRIVATE ${DDPLUG_WARNINGS})
add_executable(fault-store ${CMAKE_CURRENT_SOURCE_DIR}/faults/fault_store.c)
target_link_libraries(fault-store PRIVATE ddplug_internal)
target_compile_options(fault-store PRIVATE ${DDPLUG_WARNINGS})
set_target_properties(fault-rank fault-store PROPERTIES BUILD_RPATH "${CMAKE_BINARY_DIR}/lib")

# Its bounds are about the production build: not registered in sanitizer
# builds (the helpers still build there).
if(DDPLUG_PYTHON)
  set(_faults_python ${DDPLUG_PYTHON})
else()
  find_program(_faults_python NAMES python3)
endif()
if(_faults_python AND NOT DDPLUG_SANITIZE)
  foreach(_group timeouts join intruders launcher)
    add_test(NAME faults-${_group}
      COMMAND ${_faults_python} ${CMAKE_CURRENT_SOURCE_DIR}/faults/faults.py
              --build ${CMAKE_BINARY_DIR} --only ${_group})
    set_tests_properties(faults-${_group} PROPERTIES TIMEOUT 300 LABELS faults)
  endforeach()
endif()
