# ddplug_add_plugin(<name> SOURCES <src>... [INCLUDE_DIRS <dir>...]
#                   [DESTINATION <dir>] [NO_INSTALL])
#
# Builds libddplug-<name>.so, a MODULE (dlopen'ed, never linked against),
# with hidden visibility and a version script that exports only
# ddplug_plugin_entry_v<MAJOR>; the target is named ddplug-<name>. <name>
# must be the name the plugin's table reports (the runtime warns when the
# file name and the table disagree).
#
# Install rule (component "runtime"), unless NO_INSTALL:
#   DESTINATION given: there (relative to CMAKE_INSTALL_PREFIX, or absolute).
#     DESTINATION ${ddplug_PLUGIN_DIR} installs beside ddplug's own plugins,
#     where every libddplug of that install finds it by name.
#   otherwise: <libdir>/ddplug under your project's install prefix. Installed
#     into the same prefix as ddplug, libddplug finds it by name; elsewhere,
#     point DDPLUG_PLUGIN_PATH at that directory or give the file's path.
#
# From an installed ddplug: find_package(ddplug CONFIG REQUIRED) defines it
# (and ddplug::headers, ddplug_PLUGIN_DIR). See docs/writing-a-backend.md.
set(_DDPLUG_PLUGIN_MAP ${CMAKE_CURRENT_LIST_DIR}/plugin.map)
function(ddplug_add_plugin name)
  cmake_parse_arguments(P "NO_INSTALL" "DESTINATION" "SOURCES;INCLUDE_DIRS" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "ddplug_add_plugin(${name}): no SOURCES given")
  endif()
  set(target ddplug-${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME "ddplug-${name}"
    C_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)
  if(TARGET ddplug_headers)
    target_link_libraries(${target} PRIVATE ddplug_headers)
  else()
    target_link_libraries(${target} PRIVATE ddplug::headers)
  endif()
  if(P_INCLUDE_DIRS)
    target_include_directories(${target} BEFORE PRIVATE ${P_INCLUDE_DIRS})
  endif()
  if(DEFINED DDPLUG_WARNINGS)
    target_compile_options(${target} PRIVATE ${DDPLUG_WARNINGS})
  endif()
  target_link_options(${target} PRIVATE
    "-Wl,--version-script=${_DDPLUG_PLUGIN_MAP}" "-Wl,--no-undefined")
  if(P_NO_INSTALL)
    return()
  endif()
  if(P_DESTINATION)
    set(dest "${P_DESTINATION}")
  elseif(DEFINED DDPLUG_PLUGIN_INSTALL_DIR)
    set(dest "${DDPLUG_PLUGIN_INSTALL_DIR}")
  else()
    include(GNUInstallDirs)
    set(dest "${CMAKE_INSTALL_LIBDIR}/ddplug")
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION "${dest}" COMPONENT runtime)
endfunction()
