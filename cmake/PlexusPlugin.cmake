# plexus_add_plugin(NAME SOURCES ... [LIBRARIES ...])
#
# Builds a plugin the way a third party would: a MODULE library against the SDK target only,
# hidden visibility (only the entry point is exported), named libplexus-<NAME>.so and placed in
# the plugin directory of the build tree and of the install.
# Outside the Plexus tree (an installed SDK) the plugin lands in the build directory and installs
# to lib/plexus/plugins.
if(NOT DEFINED PLEXUS_PLUGIN_OUTPUT_DIR)
  set(PLEXUS_PLUGIN_OUTPUT_DIR ${CMAKE_BINARY_DIR})
endif()
if(NOT DEFINED PLEXUS_PLUGIN_INSTALL_DIR)
  set(PLEXUS_PLUGIN_INSTALL_DIR lib/plexus/plugins)
endif()

function(plexus_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  set(target plexus_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE Plexus::sdk ${ARG_LIBRARIES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "plexus-${name}"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${PLEXUS_PLUGIN_OUTPUT_DIR})
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  install(TARGETS ${target} LIBRARY DESTINATION ${PLEXUS_PLUGIN_INSTALL_DIR})
endfunction()
