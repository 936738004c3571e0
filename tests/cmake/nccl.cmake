# The nccl plugin's tests (tests/c/test-nccl-*.c). They exit 77 (skipped)
# where they cannot run: every one when the plugin is not built; the GPU
# cases when no CUDA device is visible.
foreach(_t test-nccl-plugin test-nccl-open test-nccl-gpu test-nccl-fake)
  if(TARGET ${_t})
    set_tests_properties(${_t} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()

if(TARGET ddplug_nccl_objs)
  # test-nccl-plugin reaches the plugin's internals: link its objects.
  if(TARGET test-nccl-plugin)
    target_link_libraries(test-nccl-plugin PRIVATE ddplug_nccl_objs ${CMAKE_DL_LIBS})
    target_compile_definitions(test-nccl-plugin PRIVATE DDPLUG_TEST_NCCL=1)
    add_dependencies(test-nccl-plugin ddplug-nccl)
  endif()
  # The runtime-level tests only need the CUDA runtime (for device buffers
  # and to see whether a GPU is there) and the plugin built.
  foreach(_t test-nccl-open test-nccl-gpu)
    if(TARGET ${_t})
      target_link_libraries(${_t} PRIVATE ddplug_nccl_cudart ${CMAKE_DL_LIBS})
      target_compile_definitions(${_t} PRIVATE DDPLUG_TEST_NCCL=1)
      add_dependencies(${_t} ddplug-nccl)
    endif()
  endforeach()
  # nccl_test_values.h reads and writes elements with the conformance
  # suite's elements.h (test-nccl-gpu, test-nccl-fake).
  if(TARGET test-nccl-gpu)
    target_include_directories(test-nccl-gpu PRIVATE ${PROJECT_SOURCE_DIR}/plugins/conformance)
  endif()
  # test-nccl-fake: the plugin's sources against an in-process fake of the
  # CUDA runtime and NCCL (tests/nccl-fake), instead of the real libraries.
  if(TARGET test-nccl-fake)
    get_property(_src GLOBAL PROPERTY DDPLUG_NCCL_SOURCES)
    get_property(_inc GLOBAL PROPERTY DDPLUG_NCCL_INCLUDE_DIRS)
    target_sources(test-nccl-fake PRIVATE ${_src}
                   ${PROJECT_SOURCE_DIR}/tests/nccl-fake/fake_cuda_nccl.c)
    target_include_directories(test-nccl-fake SYSTEM PRIVATE ${_inc})
    target_include_directories(test-nccl-fake PRIVATE
      ${PROJECT_SOURCE_DIR}/plugins/nccl ${PROJECT_SOURCE_DIR}/tests/nccl-fake
      ${PROJECT_SOURCE_DIR}/plugins/conformance)
    target_link_libraries(test-nccl-fake PRIVATE ddplug_dep_jansson Threads::Threads)
    target_compile_definitions(test-nccl-fake PRIVATE DDPLUG_TEST_NCCL=1)
  endif()
endif()

# `ddplug info nccl` reports the plugin (loads without a GPU or driver).
if(TARGET ddplug-nccl AND TARGET ddplug_cmd)
  add_test(NAME nccl-info COMMAND ddplug_cmd info nccl)
  set_tests_properties(nccl-info PROPERTIES ENVIRONMENT "${DDPLUG_TEST_ENV}"
    PASS_REGULAR_EXPRESSION "plugin +nccl.*capabilities +host-memory, device-memory, async, multi-node, abort, streams.*dtypes +float32, float64, float16, bfloat16, int8, uint8, int32, int64.*ops +sum, avg, min, max, prod"
    TIMEOUT 60)
endif()

# Under AddressSanitizer (DDPLUG_SANITIZE contains "address", as in the
# second pass of tests/run-all.sh) the CUDA driver cannot initialise with
# ASan's default shadow-gap protection: cuInit/cudaGetDeviceCount fail
# (typically "out of memory"), so on a GPU machine test-nccl-gpu would skip
# and the no-GPU cases of test-nccl-open/-plugin would run against a GPU that
# is there. protect_shadow_gap=0 lets the driver map what it needs. The CUDA
# driver, the static CUDA runtime and NCCL keep allocations until exit that
# LeakSanitizer would report as leaks in every rank process: those (and only
# stacks through them) are suppressed by nccl-lsan.supp; leaks of ddplug's
# own allocations are still reported. test-nccl-fake runs no CUDA code and
# keeps the defaults.
if(DDPLUG_SANITIZE MATCHES "address")
  set(_nccl_san_env
    "ASAN_OPTIONS=protect_shadow_gap=0"
    "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/nccl-lsan.supp:print_suppressions=0")
  foreach(_t test-nccl-plugin test-nccl-open test-nccl-gpu nccl-info)
    if(TEST ${_t})
      set_property(TEST ${_t} APPEND PROPERTY ENVIRONMENT ${_nccl_san_env})
    endif()
  endforeach()
endif()
