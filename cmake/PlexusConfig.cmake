# find_package(Plexus) for third-party plugin authors (an installed Plexus, `cmake --install`):
#   Plexus::sdk            the plugin ABI headers and the header-only C++ SDK (link nothing else)
#   plexus_add_plugin()    builds a loadable plugin with the right flags and visibility
#   PLEXUS_EXECUTABLE      the installed `plexus` command (plexus info, plexus train)
#   PLEXUS_PLUGIN_DIR      where the installed plugins are, which `plexus` searches by default
#   Plexus::core           the runtime, for programs that embed it (needs spdlog, zlib and threads;
#                          found here quietly, so a plugin author needs none of them)
find_package(Threads QUIET)
find_package(ZLIB QUIET)
find_package(spdlog QUIET)
include("${CMAKE_CURRENT_LIST_DIR}/PlexusTargets.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/PlexusPlugin.cmake")
get_filename_component(_plexus_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(PLEXUS_EXECUTABLE "${_plexus_prefix}/bin/plexus")
set(PLEXUS_PLUGIN_DIR "${_plexus_prefix}/lib/plexus/plugins")
unset(_plexus_prefix)
