# Third-party libraries that libddplug and the plugins link, one target each.
#
# ddplug_dependency(<name> PKG <pkg-config module spec> ARCHIVE <libX.a>)
#   defines the INTERFACE target ddplug_dep_<name>. Link that target, never
#   the pkg-config one, so that one switch decides how every dependency is
#   linked:
#
#   DDPLUG_STATIC_DEPS=OFF (default): the shared library pkg-config names,
#     from the system, as any library links its dependencies.
#
#   DDPLUG_STATIC_DEPS=ON (the Python wheel, pyproject.toml): the result
#     needs nothing outside itself but glibc. Per dependency:
#     - static: the archive <libX.a> (found in the directories pkg-config
#       reports) plus what `pkg-config --static` adds (libcrypto: -ldl
#       -pthread). Its objects are linked into libddplug and each plugin that
#       uses it and stay hidden there (libddplug's version script and the
#       plugins' export only ddplug's own names).
#     - bundled, when the archive cannot go into a shared object: an archive
#       built as position-dependent code (Debian's libjansson.a is -fPIE:
#       "relocation R_X86_64_PC32 against symbol `stdin' can not be used when
#       making a shared object"). Then the shared library is linked, and
#       installed (component runtime) into <libdir> beside libddplug, and
#       every library or plugin linking it gets an RPATH to that directory
#       ($ORIGIN, $ORIGIN/..): what auditwheel does, without renaming the file
#       (its SONAME is the system's: a process that already loaded that
#       SONAME reuses it, which the SONAME says is compatible).
#     The choice is made once per archive by linking it into a throw-away
#     shared object at configure time; the status line says which.
#   tests/wheel/test-wheel.sh checks every NEEDED entry of the wheel.
#
# ddplug_finish_dependencies() (called at the end of the top-level
# CMakeLists.txt) adds the bundling RPATHs to the targets that need them.
include_guard(GLOBAL)
find_package(PkgConfig REQUIRED)

option(DDPLUG_STATIC_DEPS
  "Link third-party libraries (jansson, ...) into ddplug's own files: statically, or bundled beside libddplug" OFF)

# Whether archive links into a shared object (cached per archive).
function(_ddplug_archive_is_pic archive out)
  string(MAKE_C_IDENTIFIER "${archive}" id)
  if(DEFINED CACHE{DDPLUG_PIC_${id}})
    set(${out} ${DDPLUG_PIC_${id}} PARENT_SCOPE)
    return()
  endif()
  set(dir ${CMAKE_BINARY_DIR}/CMakeFiles/ddplug-pic-probe)
  file(MAKE_DIRECTORY ${dir})
  execute_process(
    COMMAND ${CMAKE_C_COMPILER} -shared -o ${dir}/probe.so
            -Wl,--whole-archive ${archive} -Wl,--no-whole-archive
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(rc EQUAL 0)
    set(pic ON)
  else()
    set(pic OFF)
    string(REGEX MATCH "relocation [^\n]*" why "${err}")
    message(STATUS "ddplug: ${archive} cannot be linked into a shared object (${why})")
  endif()
  set(DDPLUG_PIC_${id} ${pic} CACHE INTERNAL "")
  set(${out} ${pic} PARENT_SCOPE)
endfunction()

function(ddplug_dependency name)
  cmake_parse_arguments(D "" "PKG;ARCHIVE" "" ${ARGN})
  set(target ddplug_dep_${name})
  if(TARGET ${target})
    return()
  endif()
  string(TOUPPER "DDPLUG_PC_${name}" pc)
  pkg_check_modules(${pc} REQUIRED IMPORTED_TARGET GLOBAL ${D_PKG})
  add_library(${target} INTERFACE)
  if(NOT DDPLUG_STATIC_DEPS)
    target_link_libraries(${target} INTERFACE PkgConfig::${pc})
    return()
  endif()

  find_library(${pc}_ARCHIVE NAMES ${D_ARCHIVE}
    HINTS ${${pc}_STATIC_LIBRARY_DIRS} ${${pc}_LIBRARY_DIRS}
    NO_CACHE)
  set(pic OFF)
  if(${pc}_ARCHIVE)
    _ddplug_archive_is_pic(${${pc}_ARCHIVE} pic)
  endif()
  if(pic)
    # What the archive itself needs: `pkg-config --static --libs` minus the
    # library's own name (e.g. libcrypto: dl, pthread).
    set(extra "")
    foreach(lib IN LISTS ${pc}_STATIC_LIBRARIES)
      if(NOT lib IN_LIST ${pc}_LIBRARIES)
        list(APPEND extra ${lib})
      endif()
    endforeach()
    target_include_directories(${target} INTERFACE ${${pc}_INCLUDE_DIRS})
    target_link_libraries(${target} INTERFACE ${${pc}_ARCHIVE} ${extra})
    string(JOIN " " also ${extra})
    message(STATUS "ddplug: ${name} linked statically: ${${pc}_ARCHIVE} ${also}")
    return()
  endif()

  # Bundled: link the shared library, install the file its SONAME names.
  list(GET ${pc}_LINK_LIBRARIES 0 shared)
  if(NOT shared OR NOT EXISTS "${shared}")
    message(FATAL_ERROR "ddplug: DDPLUG_STATIC_DEPS=ON: no usable ${D_ARCHIVE} and no "
                        "shared library of ${D_PKG} to bundle")
  endif()
  execute_process(COMMAND readelf -d "${shared}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  string(REGEX MATCH "soname: \\[([^]]+)\\]" _m "${dyn}")
  set(soname "${CMAKE_MATCH_1}")
  if(NOT rc EQUAL 0 OR soname STREQUAL "")
    message(FATAL_ERROR "ddplug: cannot read the SONAME of ${shared} (readelf -d)")
  endif()
  file(REAL_PATH "${shared}" real)
  target_link_libraries(${target} INTERFACE PkgConfig::${pc})
  install(FILES "${real}" DESTINATION ${CMAKE_INSTALL_LIBDIR} RENAME "${soname}"
          COMPONENT runtime)
  set_property(GLOBAL APPEND PROPERTY DDPLUG_BUNDLED_DEPS ${target})
  message(STATUS "ddplug: ${name} bundled: ${real} is installed as <libdir>/${soname}")
endfunction()

# Add the RPATHs that find bundled dependencies to every shared library and
# plugin linking one (in the directories below the top-level one).
function(_ddplug_bundle_rpaths dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(bundled GLOBAL PROPERTY DDPLUG_BUNDLED_DEPS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(SHARED|MODULE)_LIBRARY$")
      continue()
    endif()
    get_target_property(libs ${t} LINK_LIBRARIES)
    foreach(dep IN LISTS bundled)
      if(dep IN_LIST libs)
        # libddplug sits in <libdir>, the plugins in <libdir>/ddplug.
        set_property(TARGET ${t} APPEND PROPERTY INSTALL_RPATH "$ORIGIN" "$ORIGIN/..")
        break()
      endif()
    endforeach()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _ddplug_bundle_rpaths(${sub})
  endforeach()
endfunction()

function(ddplug_finish_dependencies)
  get_property(bundled GLOBAL PROPERTY DDPLUG_BUNDLED_DEPS)
  if(bundled)
    _ddplug_bundle_rpaths(${CMAKE_SOURCE_DIR})
  endif()
endfunction()
