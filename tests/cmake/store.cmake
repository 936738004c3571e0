# Rendezvous store extras: a libFuzzer target over the store's input path
# (frame cutting, the integrity layer, decoding, key table). It is built
# with clang — the project's compiler when that is clang, else a clang found
# beside it (the Makefile installs one) — and not in sanitizer builds (it
# has ASan and UBSan of its own). ctest runs a fixed 150,000 inputs from a
# fixed seed (the same work on a busy or a quiet machine, about 20 s on 2
# cores); for a long run:
#   build/bin/fuzz-store-frames -max_total_time=600 -max_len=4096 CORPUS_DIR
# (libcrypto found directly: this program is built outside the targets
# that ddplug_dependency links.)
find_package(OpenSSL 3.0 REQUIRED COMPONENTS Crypto)
set(_store_src ${PROJECT_SOURCE_DIR}/abi/src)
set(_fuzz_sources ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz-store-frames.c
    ${_store_src}/store/proto.c ${_store_src}/store/table.c
    ${_store_src}/store/crypto.c ${_store_src}/base/util.c)
set(_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
set(_fuzz_bin ${CMAKE_BINARY_DIR}/bin/fuzz-store-frames)
find_program(DDPLUG_CLANG NAMES clang clang-19 clang-18 clang-16 clang-14)
if(DDPLUG_SANITIZE)
  # the sanitizer pass: the fuzzer is the normal build's
elseif(CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz-store-frames ${_fuzz_sources})
  target_include_directories(fuzz-store-frames PRIVATE ${_store_src})
  target_link_libraries(fuzz-store-frames PRIVATE ddplug_headers OpenSSL::Crypto Threads::Threads)
  target_compile_options(fuzz-store-frames PRIVATE ${DDPLUG_WARNINGS} ${_fuzz_flags})
  target_link_options(fuzz-store-frames PRIVATE ${_fuzz_flags})
elseif(DDPLUG_CLANG)
  add_custom_command(OUTPUT ${_fuzz_bin}
    COMMAND ${DDPLUG_CLANG} -std=c11 -D_GNU_SOURCE -g -O1 ${DDPLUG_WARNINGS} ${_fuzz_flags}
            -I${_store_src} -I${PROJECT_SOURCE_DIR}/abi/include ${_fuzz_sources}
            ${OPENSSL_CRYPTO_LIBRARY} -lpthread -ldl -o ${_fuzz_bin}
    DEPENDS ${_fuzz_sources} ${_store_src}/store/store.h ${_store_src}/base/base.h
    COMMENT "Building the store's fuzz target with ${DDPLUG_CLANG}" VERBATIM)
  add_custom_target(fuzz-store-frames ALL DEPENDS ${_fuzz_bin})
endif()
if(TARGET fuzz-store-frames)
  add_test(NAME fuzz-store-frames
           COMMAND ${_fuzz_bin} -runs=150000 -seed=1 -max_len=4096 -timeout=10
                   -print_final_stats=1)
  set_tests_properties(fuzz-store-frames PROPERTIES TIMEOUT 300)
endif()
