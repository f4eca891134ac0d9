# Finds the libraries Plexus builds on. All come from Debian (or Ubuntu) packages; the GPU
# machine lacks toml++, whose headers can be carried in and found through CMAKE_PREFIX_PATH.

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# Boost.DLL is header-only. CONFIG: Boost's own package file (Debian's 1.74 and Ubuntu's 1.83
# both ship it); CMake 3.30 and later warn about, and will drop, the FindBoost module (CMP0167).
find_package(Boost 1.74 REQUIRED CONFIG)
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

# ---- CUDA (optional): the CUDA plugin is built whenever the toolkit is found ----
# nvcc on the PATH (or CMAKE_CUDA_COMPILER) switches it on; PLEXUS_CUDA=OFF switches it off.
# Architectures: sm_80 and sm_90 unless CMAKE_CUDA_ARCHITECTURES says otherwise.
option(PLEXUS_CUDA "Build the CUDA plugin when the CUDA toolkit is found" ON)
set(PLEXUS_HAVE_CUDA OFF)
if(PLEXUS_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90 CACHE STRING "GPU architectures the CUDA plugin is built for")
    endif()
    enable_language(CUDA)
    # CMake 3.25 (Debian 12) does not know that nvcc 13 speaks C++20 (the SDK asks for it).
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    find_package(CUDAToolkit REQUIRED)
    # cuDNN 9: under the toolkit on some machines, in the multiarch folders (Ubuntu's packages)
    # on others. Found, never hard-coded.
    find_path(PLEXUS_CUDNN_INCLUDE_DIR cudnn_version.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES x86_64-linux-gnu aarch64-linux-gnu)
    find_library(PLEXUS_CUDNN_LIBRARY cudnn
      HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
      PATH_SUFFIXES lib lib64 x86_64-linux-gnu aarch64-linux-gnu)
    if(PLEXUS_CUDNN_INCLUDE_DIR AND PLEXUS_CUDNN_LIBRARY)
      file(STRINGS ${PLEXUS_CUDNN_INCLUDE_DIR}/cudnn_version.h _cudnn_major
           REGEX "^#define CUDNN_MAJOR [0-9]+")
      string(REGEX MATCH "[0-9]+" PLEXUS_CUDNN_MAJOR "${_cudnn_major}")
    endif()
    if(NOT PLEXUS_CUDNN_MAJOR OR PLEXUS_CUDNN_MAJOR LESS 9)
      message(WARNING "CUDA found but not cuDNN 9 (headers: ${PLEXUS_CUDNN_INCLUDE_DIR}, "
                      "library: ${PLEXUS_CUDNN_LIBRARY}); the CUDA plugin is not built")
    else()
      add_library(plexus_cudnn INTERFACE)
      target_include_directories(plexus_cudnn SYSTEM INTERFACE ${PLEXUS_CUDNN_INCLUDE_DIR})
      target_link_libraries(plexus_cudnn INTERFACE ${PLEXUS_CUDNN_LIBRARY})
      set(PLEXUS_HAVE_CUDA ON)
      message(STATUS "CUDA plugin: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                     "${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${PLEXUS_CUDNN_MAJOR} (${PLEXUS_CUDNN_LIBRARY})")
    endif()
  else()
    message(STATUS "CUDA plugin: no CUDA compiler found, not built")
  endif()
endif()
