# check-config.cmake — ctest cases for `ddplug check-config`, run on the
# built command. This file has two modes:
#   included by tests/CMakeLists.txt: registers the cases below;
#   run as `cmake -DMODE=... -DCMD=... -DSRC=... -P check-config.cmake`:
#     runs one case and fails (FATAL_ERROR) with what differed.
# Cases: every example config and good config passes (exit 0, one "FILE: ok:"
# line), every bad config fails with exactly its .err text on stderr (exit
# 1), standard input ('-'), --json, a missing file, and usage errors (exit 2).
# Also registered here: config-schema-jsonschema (tests/data/config/
# schema_check.py), the generated schema checked by an independent validator.

if(NOT CMAKE_SCRIPT_MODE_FILE)
  foreach(_mode examples good bad stdin json missing usage)
    add_test(NAME check-config-${_mode}
      COMMAND ${CMAKE_COMMAND} -DMODE=${_mode} -DCMD=$<TARGET_FILE:ddplug_cmd>
              -DSRC=${PROJECT_SOURCE_DIR} -DWORK=${CMAKE_CURRENT_BINARY_DIR}
              -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(check-config-${_mode} PROPERTIES
      ENVIRONMENT "${DDPLUG_TEST_ENV}" TIMEOUT 120 LABELS config)
  endforeach()
  # The generated JSON Schema against an independent validator (Python
  # jsonschema, which `make` installs into the project's venv; skipped, exit
  # 77, in a build configured without that Python).
  if(DDPLUG_PYTHON)
    set(_schema_python ${DDPLUG_PYTHON})
  else()
    find_program(_schema_python NAMES python3 python)
  endif()
  if(_schema_python)
    add_test(NAME config-schema-jsonschema
      COMMAND ${_schema_python} ${PROJECT_SOURCE_DIR}/tests/data/config/schema_check.py
              ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/share/ddplug/ddplug-config.schema.json)
    set_tests_properties(config-schema-jsonschema PROPERTIES
      SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS config)
  endif()
  return()
endif()

# ---- run mode -------------------------------------------------------------

set(_data ${SRC}/tests/data/config)

# run(<rc-var> <out-var> <err-var> ARGS...) — the command with ARGS.
function(run rc_var out_var err_var)
  execute_process(COMMAND ${CMD} ${ARGN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# expect_ok(FILE) — exit 0, one "FILE: ok: plugin ..." line, nothing on stderr.
function(expect_ok file)
  run(rc out err check-config ${file})
  string(REGEX MATCH "^[^\n]*\n$" one_line "${out}")
  string(LENGTH "${file}: ok: " head_len)
  string(SUBSTRING "${out}" 0 ${head_len} head)
  string(SUBSTRING "${out}" ${head_len} -1 rest)
  if(NOT rc EQUAL 0 OR NOT err STREQUAL "" OR NOT one_line
     OR NOT head STREQUAL "${file}: ok: "
     OR NOT rest MATCHES "^plugin [^,]+, .*sampler (distributed|bucket) \\(.*, audit .*rendezvous .*timeout [0-9.e+-]+ s")
    message(FATAL_ERROR "check-config ${file}: exit ${rc}\nstdout: ${out}\nstderr: ${err}")
  endif()
  message(STATUS "ok: ${out}")
endfunction()

if(MODE STREQUAL "examples" OR MODE STREQUAL "good")
  if(MODE STREQUAL "examples")
    file(GLOB _files ${SRC}/examples/configs/*.json)
  else()
    file(GLOB _files ${_data}/good/*.json)
  endif()
  list(LENGTH _files _n)
  if(_n EQUAL 0)
    message(FATAL_ERROR "no ${MODE} configs found")
  endif()
  foreach(_f IN LISTS _files)
    expect_ok(${_f})
  endforeach()

elseif(MODE STREQUAL "bad")
  file(GLOB _files ${_data}/bad/*.json)
  list(LENGTH _files _n)
  if(_n LESS 30)
    message(FATAL_ERROR "only ${_n} bad configs in ${_data}/bad")
  endif()
  foreach(_f IN LISTS _files)
    string(REGEX REPLACE "\\.json$" ".err" _errfile "${_f}")
    file(READ ${_errfile} _want)
    string(REPLACE "{file}" "${_f}" _want "${_want}")
    run(rc out err check-config ${_f})
    if(NOT rc EQUAL 1 OR NOT out STREQUAL "" OR NOT err STREQUAL _want)
      message(FATAL_ERROR "check-config ${_f}: exit ${rc} (want 1)\nstdout: ${out}\n"
                          "stderr: ${err}\nwant:   ${_want}")
    endif()
  endforeach()
  message(STATUS "${_n} bad configs: exit 1 and the exact error")

elseif(MODE STREQUAL "stdin")
  execute_process(COMMAND ${CMD} check-config - INPUT_FILE ${_data}/good/full.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^<stdin>: ok: plugin cpu, world rank 2 of 8, ")
    message(FATAL_ERROR "check-config - < full.json: exit ${rc}\n${out}${err}")
  endif()
  execute_process(COMMAND ${CMD} check-config - INPUT_FILE ${_data}/bad/16-unknown-key-suggest.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err STREQUAL
     "<stdin>: sampler.shufle: unknown key (did you mean 'shuffle'?)\n")
    message(FATAL_ERROR "check-config - < bad: exit ${rc}\n${out}${err}")
  endif()

elseif(MODE STREQUAL "json")
  run(rc out err check-config --json ${_data}/good/minimal.json)
  if(NOT rc EQUAL 0 OR NOT out MATCHES
     "^\\{\"checks\":\\{\"duplicate_gpu\":\"error\",\"param_sync_every\":0\\},.*\"plugin\":\"cpu\",.*\"timeouts\":\\{\"collective_s\":300,\"run_once_s\":0\\},\"torch_distributed\":true\\}\n$")
    message(FATAL_ERROR "check-config --json: exit ${rc}\n${out}${err}")
  endif()

elseif(MODE STREQUAL "missing")
  run(rc out err check-config ${WORK}/no-such-config.json)
  if(NOT rc EQUAL 1 OR NOT err STREQUAL
     "cannot open config file '${WORK}/no-such-config.json': No such file or directory\n")
    message(FATAL_ERROR "check-config missing file: exit ${rc}\n${out}${err}")
  endif()

elseif(MODE STREQUAL "usage")
  set(_minimal ${_data}/good/minimal.json)
  foreach(_args "check-config" "check-config;${_minimal};${_minimal}"
                "check-config;--frobnicate;${_minimal}")
    run(rc out err ${_args})
    if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: ddplug check-config")
      message(FATAL_ERROR "ddplug ${_args}: exit ${rc} (want 2)\n${out}${err}")
    endif()
  endforeach()
  run(rc out err check-config --help)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: ddplug check-config")
    message(FATAL_ERROR "ddplug check-config --help: exit ${rc}\n${out}${err}")
  endif()

else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
