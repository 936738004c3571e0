# Smoke tests of the benchmark program ddplug-allreduce-perf
# (bench/allreduce_perf.c) with the cpu plugin, so that a broken benchmark
# is noticed by ctest: small sizes (8 B to 64 KiB), few iterations, ranks it
# launches itself (one node, and two simulated nodes with a 16-bit type;
# registered buffers, -R, in place, on one node).
# Each must exit 0, print its table up to the largest size, and its own
# result check (one verified allreduce per size) must find no wrong
# element. Times are printed, never checked.
#
# This file is both: included by tests/CMakeLists.txt (registers the tests)
# and, with -P, the script a test runs (PROG, ARGS, MAX_SIZE given by -D).
if(CMAKE_SCRIPT_MODE_FILE)
  separate_arguments(_args UNIX_COMMAND "${ARGS}")
  execute_process(COMMAND ${PROG} ${_args} RESULT_VARIABLE _rc
                  OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 240)
  message("${_out}${_err}")
  if(NOT _rc STREQUAL "0")
    message(FATAL_ERROR "ddplug-allreduce-perf ${ARGS} exited with ${_rc}")
  endif()
  if(NOT _out MATCHES "\n +${MAX_SIZE} +[0-9]+ +[a-z0-9]+ +[a-z]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0\n")
    message(FATAL_ERROR "ddplug-allreduce-perf ${ARGS}: no row for ${MAX_SIZE} bytes with 0 wrong elements")
  endif()
  if(NOT _out MATCHES "# total wrong elements: 0\n")
    message(FATAL_ERROR "ddplug-allreduce-perf ${ARGS}: its result check failed")
  endif()
  return()
endif()

if(TARGET ddplug-allreduce-perf AND TARGET ddplug-cpu)
  set(_bench_smoke_cases
    "cpu-bench-allreduce-perf-smoke|-b 8 -e 64K -f 2 -n 2 -w 1 -i 3"
    "cpu-bench-allreduce-perf-smoke-two-nodes|-b 16 -e 64K -f 4 -n 4 -N 2 -d bfloat16 -o avg -w 1 -i 3"
    "cpu-bench-allreduce-perf-smoke-registered|-b 16 -e 64K -f 4 -n 3 -R -I -w 1 -i 3")
  foreach(_case IN LISTS _bench_smoke_cases)
    string(REPLACE "|" ";" _parts "${_case}")
    list(GET _parts 0 _name)
    list(GET _parts 1 _args)
    add_test(NAME ${_name}
             COMMAND ${CMAKE_COMMAND} -DPROG=$<TARGET_FILE:ddplug-allreduce-perf>
                     "-DARGS=${_args}" -DMAX_SIZE=65536
                     -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(${_name} PROPERTIES ENVIRONMENT "${DDPLUG_TEST_ENV}" TIMEOUT 300)
  endforeach()
endif()
