# Finds the libraries Plexus builds on. All come from Debian (or Ubuntu) packages; the GPU
# machine lacks toml++, whose headers can be carried in and found through CMAKE_PREFIX_PATH.
#
# PLEXUS_FALLBACK_PREFIXES: install prefixes searched after the system's own (appended to
# CMAKE_SYSTEM_PREFIX_PATH), for a machine that lacks some of these libraries: the GPU machine's
# image, which gets Debian's packages carried in (tests/gpu/stage_deps.sh, one prefix each). A
# library the machine has is found first; only what it lacks comes from these.
set(PLEXUS_FALLBACK_PREFIXES "" CACHE STRING
    "Install prefixes searched after the system's, for libraries the machine lacks")
if(PLEXUS_FALLBACK_PREFIXES)
  list(APPEND CMAKE_SYSTEM_PREFIX_PATH ${PLEXUS_FALLBACK_PREFIXES})
endif()
# Whether a path found lies under one of the fallback prefixes (its libraries then need a run
# path that reaches their own dependencies: see the CPU plugin).
function(plexus_from_fallback path out)
  set(${out} OFF PARENT_SCOPE)
  foreach(p ${PLEXUS_FALLBACK_PREFIXES})
    string(FIND "${path}" "${p}/" at)
    if(at EQUAL 0)
      set(${out} ON PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

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
plexus_from_fallback("${PLEXUS_OPENBLAS_LIBRARY}" PLEXUS_OPENBLAS_FROM_FALLBACK)
add_library(plexus_openblas INTERFACE)
target_include_directories(plexus_openblas SYSTEM INTERFACE ${PLEXUS_CBLAS_INCLUDE_DIR})
target_link_libraries(plexus_openblas INTERFACE ${PLEXUS_OPENBLAS_LIBRARY})

# The folders of Python's nvidia-<name> wheels (site-packages/nvidia/<name>, where PyTorch's
# cuDNN and NCCL live) as `out`, for machines whose only cuDNN or NCCL came with PyTorch.
function(plexus_python_nvidia_dirs name out)
  set(${out} "" PARENT_SCOPE)
  find_program(PLEXUS_PYTHON3 python3)
  if(NOT PLEXUS_PYTHON3)
    return()
  endif()
  execute_process(
    COMMAND ${PLEXUS_PYTHON3} -c
      "import importlib.util as u; s = u.find_spec('nvidia.${name}'); print(';'.join(s.submodule_search_locations) if s else '')"
    OUTPUT_VARIABLE dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND dirs)
    set(${out} ${dirs} PARENT_SCOPE)
  endif()
endfunction()

# The include folders of the install that library `lib` belongs to, as `out` (for find_path's
# HINTS): <prefix>/lib -> <prefix>/include, <prefix>/lib/<multiarch> -> <prefix>/include.
function(plexus_include_beside lib out)
  set(${out} "" PARENT_SCOPE)
  if(lib)
    get_filename_component(dir ${lib} DIRECTORY)
    set(${out} ${dir}/../include ${dir}/../../include PARENT_SCOPE)
  endif()
endfunction()

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
    # CUDNN_ROOT (a variable or the environment) points at any other install; last, the cuDNN
    # of Python's nvidia-cudnn wheel (where PyTorch gets it: site-packages/nvidia/cudnn), whose
    # library has only its versioned name.
    plexus_python_nvidia_dirs(cudnn _plexus_pip_cudnn)
    find_library(PLEXUS_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
      HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
      PATHS ${_plexus_pip_cudnn}
      PATH_SUFFIXES lib lib64 x86_64-linux-gnu aarch64-linux-gnu)
    # The header from the library's own install first (a header newer than the library would
    # describe functions it does not have).
    plexus_include_beside("${PLEXUS_CUDNN_LIBRARY}" _plexus_cudnn_header_hints)
    find_path(PLEXUS_CUDNN_INCLUDE_DIR cudnn_version.h
      HINTS ${_plexus_cudnn_header_hints} ${CUDNN_ROOT}/include $ENV{CUDNN_ROOT}/include
            ${CUDAToolkit_INCLUDE_DIRS}
      PATHS ${_plexus_pip_cudnn}
      PATH_SUFFIXES include x86_64-linux-gnu aarch64-linux-gnu)
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
