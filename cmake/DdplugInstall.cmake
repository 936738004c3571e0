# Where things are installed, relative to each other, so that an install
# works wherever it is moved (`cmake --install build --prefix X`, a wheel):
#   <bindir>/ddplug ...            programs, RPATH $ORIGIN/<bindir → libdir>
#   <libdir>/libddplug.so.1        the library
#   <libdir>/ddplug/libddplug-*.so the plugins, which libddplug finds
#                                  relative to its own location
#                                  (abi/src/plugin/loader.c)
# Components: "runtime" (library, plugins, programs) and "development"
# (headers, CMake package, pkg-config file, schema). The wheel installs only
# the runtime.
include_guard(GLOBAL)
include(GNUInstallDirs)

option(DDPLUG_PLUGIN_SEARCH_PREFIX
  "Also search the configured install prefix's plugin directory (off in the wheel, whose prefix is a staging directory)" ON)

set(DDPLUG_PLUGIN_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/ddplug)
# GNUInstallDirs makes an absolute CMAKE_INSTALL_<dir> stay absolute; the
# relative forms below are what the RPATHs and the loader use.
file(RELATIVE_PATH DDPLUG_BIN_TO_LIB
     ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
string(REGEX REPLACE "/$" "" DDPLUG_BIN_TO_LIB "${DDPLUG_BIN_TO_LIB}")
if(DDPLUG_BIN_TO_LIB STREQUAL "")
  set(DDPLUG_BIN_TO_LIB ".")
endif()
file(RELATIVE_PATH DDPLUG_LIB_TO_PLUGINS
     ${CMAKE_INSTALL_FULL_LIBDIR} ${CMAKE_INSTALL_FULL_LIBDIR}/ddplug)

# ddplug_install_program(<target>...): install a program into <bindir> with
# an RPATH relative to itself, so it finds libddplug in any prefix.
function(ddplug_install_program)
  foreach(target IN LISTS ARGN)
    set_property(TARGET ${target} APPEND PROPERTY INSTALL_RPATH "$ORIGIN/${DDPLUG_BIN_TO_LIB}")
    install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endforeach()
endfunction()
