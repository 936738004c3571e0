# Smoke test of the benchmark program ddplug-elastic-perf (bench/elastic_perf.c):
# small sizes, 2 and 3 ranks; it must exit 0 and print both tables. Times are
# printed, never checked.
if(TARGET ddplug-elastic-perf AND TARGET ddplug-cpu)
  add_test(NAME cpu-bench-elastic-perf-smoke
           COMMAND $<TARGET_FILE:ddplug-elastic-perf> -n 2,3 -s 64K -c 200 -k 5 -i 20 -N 10000)
  set_tests_properties(cpu-bench-elastic-perf-smoke PROPERTIES
    ENVIRONMENT "${DDPLUG_TEST_ENV}" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "# restart: .*\n +3 +[0-9.]+ +[0-9.]+ +[0-9.]+\n")
endif()
