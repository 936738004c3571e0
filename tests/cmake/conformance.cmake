# `ddplug conformance` (tests/conformance/check.sh runs it and checks the
# report) against every plugin we ship: cpu, and nccl where it is built
# (without a GPU its group checks are skipped with the reason); the example
# backend; the test plugin with sampler slots (its sampler checks must pass,
# not skip); and a misbehaving plugin whose two mistakes the suite must
# report (exit 1; tests/plugins/misbehaving).
set(_check ${PROJECT_SOURCE_DIR}/tests/conformance/check.sh)
add_test(NAME conformance-cpu COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd> cpu --
  "^  PASS  a rank whose group_create fails ends the others' ddplug_open promptly$"
  "^  PASS  point-to-point: a count mismatch fails the receive, the run goes on$"
  "^  PASS  point-to-point: a peer killed while a receive waits for it: PEER_LOST naming it$"
  "^conformance: [0-9]+ passed, 0 failed, [0-9]+ skipped$")
add_test(NAME conformance-example COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd> example --
  "^  PASS  mismatch: count differs"
  "^  PASS  a plugin without point-to-point: UNSUPPORTED naming the operation$")
# -s: only the scenarios named (after the table and the life cycle), no
# per-slot rows; an unknown name is refused with the list
add_test(NAME conformance-scenario COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd> -s abort,mismatch
  example -- "^  PASS  group: created on every rank" "^  PASS  mismatch: count differs"
  "!allreduce float32" "!^slots " "^conformance: [0-9]+ passed, 0 failed, [0-9]+ skipped$")
add_test(NAME conformance-scenario-unknown COMMAND ${_check} 2 $<TARGET_FILE:ddplug_cmd> -s abort,nosuch
  example -- "--scenario: no scenario 'nosuch'; the scenarios are: table, lifecycle, coll")
set(_conf_tests conformance-cpu conformance-example conformance-scenario conformance-scenario-unknown)
if(TARGET ddplug-nccl)
  add_test(NAME conformance-nccl COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd> nccl --
    "^  PASS  identity: the table's name is the file's libddplug-<name>.so$")
  list(APPEND _conf_tests conformance-nccl)
endif()
if(TARGET ddplug-sampler-plugin)
  add_test(NAME conformance-sampler-plugin COMMAND ${_check} 0 $<TARGET_FILE:ddplug_cmd>
    $<TARGET_FILE:ddplug-sampler-plugin> -- "^  PASS  sampler \\(distributed\\)")
  list(APPEND _conf_tests conformance-sampler-plugin)
endif()
if(TARGET ddplug-misbehaving)
  add_test(NAME conformance-catches-misbehaving COMMAND ${_check} 1 $<TARGET_FILE:ddplug_cmd>
    -t 6 $<TARGET_FILE:ddplug-misbehaving> --
    "^  FAIL  allreduce int32: "
    "allreduce int32 max, out of place, 1 elements: element 0 is"
    "^  FAIL  a rank whose group_create fails ends the others' ddplug_open promptly$"
    "only after [0-9.]+ s \\(the collective timeout is 6 s\\)"
    "^  PASS  allreduce int64: ")
  list(APPEND _conf_tests conformance-catches-misbehaving)
endif()
set_tests_properties(${_conf_tests} PROPERTIES ENVIRONMENT "${DDPLUG_TEST_ENV}" TIMEOUT 900)
