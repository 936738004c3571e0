# ddplug-elastic-trainer (tests/elastic/elastic_trainer.c): the C trainer the
# elastic tests and the soak launch with `ddplug run` (tests/python/test_elastic.py).
add_executable(ddplug-elastic-trainer ${PROJECT_SOURCE_DIR}/tests/elastic/elastic_trainer.c)
target_link_libraries(ddplug-elastic-trainer PRIVATE ddplug)
target_compile_options(ddplug-elastic-trainer PRIVATE ${DDPLUG_WARNINGS})
set_target_properties(ddplug-elastic-trainer PROPERTIES BUILD_RPATH "${CMAKE_BINARY_DIR}/lib")
