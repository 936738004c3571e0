# The Python package's layers (hosts/python/README.md): import-linter checks
# the contracts in pyproject.toml ([tool.importlinter]) over every import of
# hosts/python/ddplug, a lazy one inside a function too. Needs the project's
# Python (DDPLUG_PYTHON, set by the Makefile), whose environment has the
# pinned import-linter (the Makefile's PY_DEPS). Not in sanitizer builds (no
# C code runs).
if(DDPLUG_PYTHON AND NOT DDPLUG_SANITIZE)
  get_filename_component(_py_bin ${DDPLUG_PYTHON} DIRECTORY)
  add_test(NAME python-layers
    COMMAND ${_py_bin}/lint-imports --config ${PROJECT_SOURCE_DIR}/pyproject.toml --no-cache
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(python-layers PROPERTIES
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/hosts/python" TIMEOUT 300)
endif()
