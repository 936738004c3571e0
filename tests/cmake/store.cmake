# Rendezvous store extras: a libFuzzer target over the store's input path
# (frame cutting, decoding, key table), built only when the compiler is
# clang. ctest runs it for a bounded number of inputs; run it by hand for
# longer: build/bin/fuzz-store-frames -max_total_time=300
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  set(_store_src ${PROJECT_SOURCE_DIR}/abi/src)
  add_executable(fuzz-store-frames
    ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz-store-frames.c
    ${_store_src}/store/proto.c ${_store_src}/store/table.c
    ${_store_src}/store/crypto.c ${_store_src}/base/util.c)
  target_include_directories(fuzz-store-frames PRIVATE ${_store_src})
  target_link_libraries(fuzz-store-frames PRIVATE ddplug_headers OpenSSL::Crypto Threads::Threads)
  target_compile_options(fuzz-store-frames PRIVATE ${DDPLUG_WARNINGS}
    -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz-store-frames PRIVATE -fsanitize=fuzzer,address,undefined)
  add_test(NAME fuzz-store-frames
           COMMAND fuzz-store-frames -runs=300000 -seed=1 -max_len=4096)
  set_tests_properties(fuzz-store-frames PROPERTIES TIMEOUT 300)
endif()
