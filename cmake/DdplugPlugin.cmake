# ddplug_add_plugin(<name> SOURCES <src>... [INCLUDE_DIRS <dir>...] [NO_INSTALL])
# Builds libddplug-<name>.so as a MODULE with hidden visibility and a version
# script that exports only ddplug_plugin_entry_v<MAJOR>.
set(_DDPLUG_PLUGIN_MAP ${CMAKE_CURRENT_LIST_DIR}/plugin.map)
function(ddplug_add_plugin name)
  cmake_parse_arguments(P "NO_INSTALL" "" "SOURCES;INCLUDE_DIRS" ${ARGN})
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
  if(NOT P_NO_INSTALL AND DEFINED DDPLUG_PLUGIN_INSTALL_DIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${DDPLUG_PLUGIN_INSTALL_DIR})
  endif()
endfunction()
