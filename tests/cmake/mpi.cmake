# The mpi plugin's tests. test-mpi (tests/c/test-mpi.c) starts real jobs
# with each family's launcher (mpirun.openmpi, mpiexec.hydra) and skips
# (exit 77) a family whose backend or launcher is missing; `ddplug
# conformance mpi` runs on 2, 3 and 4 ranks under each launcher. Open MPI
# refuses to run as root without its two variables: the tests set them for
# their own jobs, never for a user's environment.
if(TARGET test-mpi)
  set_tests_properties(test-mpi PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1500
    ENVIRONMENT "${DDPLUG_TEST_ENV}")
  target_link_libraries(test-mpi PRIVATE ${CMAKE_DL_LIBS})
  if(TARGET ddplug-mpi)
    add_dependencies(test-mpi ddplug-mpi ddplug-cpu)
  endif()
endif()

if(TARGET ddplug-mpi AND TARGET ddplug_cmd)
  set(_check ${PROJECT_SOURCE_DIR}/tests/conformance/check.sh)
  set(_root_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  foreach(_fam IN LISTS DDPLUG_MPI_FAMILIES)
    if(_fam STREQUAL "openmpi")
      find_program(DDPLUG_MPIRUN_OPENMPI NAMES mpirun.openmpi)
      set(_launcher "${DDPLUG_MPIRUN_OPENMPI} --oversubscribe")
      set(_have ${DDPLUG_MPIRUN_OPENMPI})
    else()
      find_program(DDPLUG_MPIEXEC_HYDRA NAMES mpiexec.hydra)
      set(_launcher "${DDPLUG_MPIEXEC_HYDRA}")
      set(_have ${DDPLUG_MPIEXEC_HYDRA})
    endif()
    if(NOT _have)
      message(STATUS "ddplug: conformance-mpi-${_fam}: no launcher found, not registered")
      continue()
    endif()
    # The default collective timeout (40 s, as conformance-cpu and users run it): "promptly"
    # is a third of it, which MPI ranks busy-polling on a loaded 2-core machine can exceed at
    # -t 10 (5.5 s seen in tests/wheel); a passing run never waits for the timeout.
    foreach(_n 2 3 4)
      set(_name conformance-mpi-${_fam}-n${_n})
      add_test(NAME ${_name} COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd> mpi -n ${_n}
        --launcher ${_launcher} --
        "^  PASS  bootstrap: the world and the store's address came from the plugin$"
        "^  PASS  allreduce bfloat16: sum avg min max prod$"
        "^  PASS  mismatch: count differs: MISMATCH on every rank, the run goes on$"
        "^conformance: [0-9]+ passed, 0 failed, [0-9]+ skipped$")
      set_tests_properties(${_name} PROPERTIES TIMEOUT 900
        ENVIRONMENT "${DDPLUG_TEST_ENV};${_root_env}")
    endforeach()
  endforeach()
endif()

# Several nodes on one machine: network namespaces joined by rate-limited
# veth links, mpirun and hydra across them through an rsh agent
# (tests/netns/). Skipped (77) where namespaces are not permitted. It runs
# the allreduce benchmark and the C trainer, so it is registered where they
# are built (not in the sanitizer pass, which builds no benchmarks).
if(TARGET ddplug-mpi AND TARGET test-mpi AND TARGET ddplug-allreduce-perf AND TARGET ddplug-c-trainer)
  add_test(NAME netns-mpi COMMAND ${PROJECT_SOURCE_DIR}/tests/netns/test-netns.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(netns-mpi PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
