# Finds the libraries Plexus builds on. All come from Debian (or Ubuntu) packages; the GPU
# machine lacks toml++, whose headers can be carried in and found through CMAKE_PREFIX_PATH.

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Boost 1.74 REQUIRED)  # Boost.DLL is header-only
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(ZLIB REQUIRED)  # gzip-compressed datasets (IDX .gz)

# toml++ is used header-only (Debian also ships a compiled library; the GPU machine does not).
find_path(PLEXUS_TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED)
add_library(plexus_tomlplusplus INTERFACE)
target_include_directories(plexus_tomlplusplus SYSTEM INTERFACE ${PLEXUS_TOMLPP_INCLUDE_DIR})
target_compile_definitions(plexus_tomlplusplus INTERFACE TOML_HEADER_ONLY=1 TOML_EXCEPTIONS=1)

# OpenBLAS with its CBLAS header. The OpenMP build comes first: the CPU plugin's own loops use
# OpenMP, and with the pthreads build two thread pools fight for the cores (libgomp's idle
# workers spin after every parallel region while OpenBLAS's threads wait): a SimpleCNN training
# step measured 2x slower (docs/benchmarks.md). Debian keeps each build in its own folder.
find_library(PLEXUS_OPENBLAS_LIBRARY NAMES openblas
  PATH_SUFFIXES openblas-openmp x86_64-linux-gnu/openblas-openmp
                openblas-pthread x86_64-linux-gnu/openblas-pthread REQUIRED)
get_filename_component(PLEXUS_OPENBLAS_DIR ${PLEXUS_OPENBLAS_LIBRARY} DIRECTORY)
get_filename_component(PLEXUS_OPENBLAS_VARIANT ${PLEXUS_OPENBLAS_DIR} NAME)
find_path(PLEXUS_CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES x86_64-linux-gnu/${PLEXUS_OPENBLAS_VARIANT} ${PLEXUS_OPENBLAS_VARIANT}
                openblas x86_64-linux-gnu REQUIRED)
message(STATUS "OpenBLAS: ${PLEXUS_OPENBLAS_LIBRARY} (headers ${PLEXUS_CBLAS_INCLUDE_DIR})")
add_library(plexus_openblas INTERFACE)
target_include_directories(plexus_openblas SYSTEM INTERFACE ${PLEXUS_CBLAS_INCLUDE_DIR})
target_link_libraries(plexus_openblas INTERFACE ${PLEXUS_OPENBLAS_LIBRARY})
