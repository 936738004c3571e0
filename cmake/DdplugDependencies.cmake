# Third-party libraries that libddplug and the plugins link, one target each.
#
# ddplug_dependency(<name> PKG <pkg-config module spec> ARCHIVE <libX.a>)
#   defines the INTERFACE target ddplug_dep_<name>. Link that target, never
#   the pkg-config one, so that one switch decides how every dependency is
#   linked:
#     DDPLUG_STATIC_DEPS=OFF (default): the shared library pkg-config names.
#     DDPLUG_STATIC_DEPS=ON: the static archive <libX.a>, found in the
#       directories pkg-config reports, plus the libraries its
#       `pkg-config --static` line adds (e.g. -ldl -pthread for libcrypto).
#       The objects are linked into libddplug and into each plugin that uses
#       them, and stay hidden there: libddplug's version script and the
#       plugins' export only ddplug's own names. The result needs nothing but
#       glibc at run time — what the Python wheel requires (pyproject.toml
#       turns this on; tests/wheel/test-wheel.sh checks NEEDED with readelf).
#   A static archive must be position-independent code (Debian's -dev
#   packages build theirs with -fPIE/-fPIC on amd64, which links into a
#   shared object once the version script keeps the symbols local).
include_guard(GLOBAL)
find_package(PkgConfig REQUIRED)

option(DDPLUG_STATIC_DEPS
  "Link third-party libraries (jansson, ...) statically into libddplug and the plugins" OFF)

function(ddplug_dependency name)
  cmake_parse_arguments(D "" "PKG;ARCHIVE" "" ${ARGN})
  set(target ddplug_dep_${name})
  if(TARGET ${target})
    return()
  endif()
  string(TOUPPER "DDPLUG_PC_${name}" pc)
  if(NOT DDPLUG_STATIC_DEPS)
    pkg_check_modules(${pc} REQUIRED IMPORTED_TARGET GLOBAL ${D_PKG})
    add_library(${target} INTERFACE)
    target_link_libraries(${target} INTERFACE PkgConfig::${pc})
    return()
  endif()
  pkg_check_modules(${pc} REQUIRED ${D_PKG})
  find_library(${pc}_ARCHIVE NAMES ${D_ARCHIVE}
    HINTS ${${pc}_STATIC_LIBRARY_DIRS} ${${pc}_LIBRARY_DIRS}
    NO_CACHE)
  if(NOT ${pc}_ARCHIVE)
    string(REPLACE ";" ", " _dirs "${${pc}_STATIC_LIBRARY_DIRS};${${pc}_LIBRARY_DIRS}")
    message(FATAL_ERROR
      "ddplug: DDPLUG_STATIC_DEPS=ON needs ${D_ARCHIVE} (the static library of "
      "${D_PKG}), which is not in the linker's search path nor in '${_dirs}'. "
      "Install the -dev package that ships it (Debian: libjansson-dev has "
      "libjansson.a), or configure with -DDDPLUG_STATIC_DEPS=OFF.")
  endif()
  # What the archive itself needs: `pkg-config --static --libs` minus the
  # library's own name (e.g. libcrypto: dl, pthread).
  set(extra "")
  foreach(lib IN LISTS ${pc}_STATIC_LIBRARIES)
    if(NOT lib IN_LIST ${pc}_LIBRARIES)
      list(APPEND extra ${lib})
    endif()
  endforeach()
  add_library(${target} INTERFACE)
  target_include_directories(${target} INTERFACE ${${pc}_INCLUDE_DIRS})
  target_link_libraries(${target} INTERFACE ${${pc}_ARCHIVE} ${extra})
  string(JOIN " " _also ${extra})
  message(STATUS "ddplug: ${name} linked statically: ${${pc}_ARCHIVE} ${_also}")
endfunction()
