# ABI compatibility: libddplug.so against the recorded release baseline
# (abi/abi-baseline/libddplug.so.1.abi) with libabigail's abidiff
# (tests/abi/check-abi.sh). Skipped (77) where abidiff is not installed.
if(EXISTS ${PROJECT_SOURCE_DIR}/abi/abi-baseline/libddplug.so.1.abi AND NOT DDPLUG_SANITIZE)
  add_test(NAME abi-compatible
    COMMAND ${PROJECT_SOURCE_DIR}/tests/abi/check-abi.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(abi-compatible PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

# abi/src's folders, their module maps and the include order of the layers
# (abi/src/README.md) stay as documented.
add_test(NAME abi-layout COMMAND python3 ${PROJECT_SOURCE_DIR}/tests/abi/check-layout.py ${PROJECT_SOURCE_DIR})
