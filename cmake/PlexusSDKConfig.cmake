# find_package(PlexusSDK) for third-party plugin authors: the plexus::sdk target (headers only)
# and plexus_add_plugin().
include("${CMAKE_CURRENT_LIST_DIR}/PlexusSDKTargets.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/PlexusPlugin.cmake")
