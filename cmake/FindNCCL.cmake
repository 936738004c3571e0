# FindNCCL — locate NCCL's header and shared library.
#
# Roots are tried in this order; the first one holding BOTH include/nccl.h
# and lib*/libnccl.so(.2) wins, so header and library always come from the
# same install:
#   1. NCCL_HOME (CMake variable, then environment variable)
#   2. the CUDA toolkit (NCCL_CUDA_ROOT, set by the caller; e.g. the
#      CUDAToolkit_LIBRARY_ROOT of find_package(CUDAToolkit))
#   3. the system (/usr, /usr/local: Debian/Ubuntu libnccl-dev)
#   4. the nvidia-nccl-cu* Python wheel of the project's Python: the
#      interpreter DDPLUG_PYTHON (the Makefile passes the venv's), else
#      <source>/.venv/bin/python, is asked where `nvidia.nccl` lives.
#
# Result variables:
#   NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY (the file), NCCL_LIBRARY_DIR
#   (its directory, resolved through symlinks: use it as the RPATH),
#   NCCL_VERSION ("2.30.7", from nccl.h), NCCL_VERSION_CODE (23007),
#   NCCL_ORIGIN (which of the roots above it came from), NCCL_SEARCHED
#   (every root tried, for error messages).
# Imported target: NCCL::nccl.

set(_nccl_roots "")
set(_nccl_origins "")
macro(_nccl_add_root dir origin)
  if(NOT "${dir}" STREQUAL "")
    list(APPEND _nccl_roots "${dir}")
    list(APPEND _nccl_origins "${origin}")
  endif()
endmacro()

if(DEFINED NCCL_HOME AND NOT "${NCCL_HOME}" STREQUAL "")
  _nccl_add_root("${NCCL_HOME}" "NCCL_HOME")
elseif(DEFINED ENV{NCCL_HOME} AND NOT "$ENV{NCCL_HOME}" STREQUAL "")
  _nccl_add_root("$ENV{NCCL_HOME}" "NCCL_HOME")
endif()
if(DEFINED NCCL_CUDA_ROOT)
  _nccl_add_root("${NCCL_CUDA_ROOT}" "CUDA toolkit")
endif()
_nccl_add_root("/usr" "system")
_nccl_add_root("/usr/local" "system")

# The wheel: ask the project's Python where nvidia.nccl lives.
set(_nccl_python "")
if(DEFINED DDPLUG_PYTHON AND EXISTS "${DDPLUG_PYTHON}")
  set(_nccl_python "${DDPLUG_PYTHON}")
elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(_nccl_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
if(_nccl_python)
  # Without the caller's PYTHONPATH: pip's isolated build environment (a
  # wheel build) sets one whose sitecustomize hides every other
  # site-packages, also from this unrelated interpreter.
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
            --unset=PYTHONHOME "${_nccl_python}" -c
            "import nvidia.nccl as n; print(list(n.__path__)[0])"
    OUTPUT_VARIABLE _nccl_wheel_dir
    RESULT_VARIABLE _nccl_wheel_rc
    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_nccl_wheel_rc EQUAL 0)
    _nccl_add_root("${_nccl_wheel_dir}" "python wheel (${_nccl_python})")
  endif()
endif()

set(NCCL_FOUND FALSE)
set(NCCL_SEARCHED "")
list(LENGTH _nccl_roots _nccl_n)
if(_nccl_n GREATER 0)
  math(EXPR _nccl_last "${_nccl_n} - 1")
  foreach(_i RANGE ${_nccl_last})
    list(GET _nccl_roots ${_i} _root)
    list(GET _nccl_origins ${_i} _origin)
    list(APPEND NCCL_SEARCHED "${_root} (${_origin})")
    if(NOT EXISTS "${_root}/include/nccl.h")
      continue()
    endif()
    set(_lib "")
    foreach(_sub lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
      foreach(_name libnccl.so libnccl.so.2)
        if(NOT _lib AND EXISTS "${_root}/${_sub}/${_name}")
          set(_lib "${_root}/${_sub}/${_name}")
        endif()
      endforeach()
    endforeach()
    if(_lib)
      set(NCCL_INCLUDE_DIR "${_root}/include")
      set(NCCL_LIBRARY "${_lib}")
      set(NCCL_ORIGIN "${_origin}")
      set(NCCL_FOUND TRUE)
      break()
    endif()
  endforeach()
endif()

if(NCCL_FOUND)
  file(REAL_PATH "${NCCL_LIBRARY}" _nccl_real)
  get_filename_component(NCCL_LIBRARY_DIR "${_nccl_real}" DIRECTORY)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defs
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_defs}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  math(EXPR NCCL_VERSION_CODE
       "${_nccl_MAJOR} * 10000 + ${_nccl_MINOR} * 100 + ${_nccl_PATCH}")
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl SHARED IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      IMPORTED_NO_SONAME FALSE
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)
