# The emulated CUDA plugin (included from tests/CMakeLists.txt; see README.md here).
set(PLEXUS_EMU_PLUGIN_DIR ${PROJECT_BINARY_DIR}/emu-plugins)
set(emu_dir ${CMAKE_CURRENT_SOURCE_DIR}/cuda/emu)
set(cuda_dir ${PROJECT_SOURCE_DIR}/plugins/cuda)
# The CUDA plugin's kernel files, all of them: the mma.sync kernels run on the emulator's PTX
# (include/plx_emu_ptx.hpp), the Hopper GEMM on its wgmma, TMA and mbarriers
# (include/plx_emu_wgmma.hpp).
set(emu_kernel_files elementwise misc optim reduce softmax norm pool linear_ce conv_pool
    gemm_bias mma_gemm igemm_conv_f16 igemm_conv_bf16 igemm_conv_f32 igemm_wgmma
    igemm_wgmma_ws direct_conv direct_small wgmma_gemm step_cnn)
# Headers with kernels and launches in them, included by several of those files: translated to
# emu/ops/NAME.cuh, which the translated files' `#include "ops/NAME.cuh"` finds first (a quoted
# include looks in the including file's folder, emu/, before the include path).
set(emu_kernel_headers igemm_conv)
set(emu_sources)
set(emu_translations)  # source, then output
foreach(f ${emu_kernel_files})
  list(APPEND emu_translations ${cuda_dir}/ops/${f}.cu ${CMAKE_CURRENT_BINARY_DIR}/emu/${f}.cpp)
endforeach()
foreach(f ${emu_kernel_headers})
  list(APPEND emu_translations ${cuda_dir}/ops/${f}.cuh ${CMAKE_CURRENT_BINARY_DIR}/emu/ops/${f}.cuh)
endforeach()
# nvcc contracts a * b + c into a fused multiply-add unless told otherwise (--fmad=true), so
# the GPU rounds such expressions once where the host, by default, rounds twice: the emulated
# kernels are built to contract alike where this machine has FMA (the _rn intrinsics still
# round each operation, plx_emu.hpp), so that a test holding a kernel's bits to the CPU's, or a
# fused kernel's to the unfused ones', sees what the GPU gives.
include(CheckCXXSourceRuns)
set(CMAKE_REQUIRED_FLAGS "-mfma")
check_cxx_source_runs([=[
#include <immintrin.h>
int main() {
  volatile float a = 1.5f, b = 2.0f, c = 0.25f;
  __m128 r = _mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c));
  return _mm_cvtss_f32(r) == 3.25f ? 0 : 1;
}]=] PLEXUS_EMU_HOST_FMA)
unset(CMAKE_REQUIRED_FLAGS)
set(emu_contract_flags -ffp-contract=off)
if(PLEXUS_EMU_HOST_FMA)
  set(emu_contract_flags -mfma -ffp-contract=fast)
else()
  message(STATUS "CUDA emulator: no FMA on this host; the emulated kernels round a * b + c twice")
endif()
while(emu_translations)
  list(POP_FRONT emu_translations src out)
  get_filename_component(name ${src} NAME)
  add_custom_command(OUTPUT ${out}
    COMMAND ${Python3_EXECUTABLE} ${emu_dir}/translate.py ${src} ${out}
    DEPENDS ${emu_dir}/translate.py ${src}
    COMMENT "CUDA emulator: translating ${name}")
  list(APPEND emu_sources ${out})
  set_source_files_properties(${out} PROPERTIES COMPILE_OPTIONS "${emu_contract_flags}")
endwhile()
# One build of the emulator: its runtime library and the emulated CUDA plugin, in plugin folder
# `dir` beside links to the CPU and MPI plugins, compiled with the extra `flags` (the memcheck
# build's AddressSanitizer).
function(plexus_emu_variant suffix dir flags)
  # The emulated runtime (with NCCL, cuBLASLt and cuDNN) is one shared library, as libcudart
  # is: the emulated CUDA and NCCL plugins share its streams, captures and allocations.
  set(rt plexus_cuda_emu_runtime${suffix})
  add_library(${rt} SHARED ${emu_dir}/runtime.cpp ${emu_dir}/nccl_emu.cpp
    ${emu_dir}/cublaslt_emu.cpp ${emu_dir}/cudnn_emu.cpp ${emu_dir}/tensormap_emu.cpp)
  target_include_directories(${rt} BEFORE PUBLIC ${emu_dir}/include)
  target_link_libraries(${rt} PUBLIC Plexus::sdk)
  # No contraction into fused multiply-adds: the kernels' __fadd_rn/__fmul_rn mean what they say.
  target_compile_options(${rt} PUBLIC -ffp-contract=off -Wno-unknown-pragmas ${flags})
  target_link_options(${rt} PUBLIC ${flags})
  set_target_properties(${rt} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/emu-lib)

  set(plugin plexus_plugin_cuda_emu${suffix})
  add_library(${plugin} MODULE ${emu_sources}
    ${cuda_dir}/backend.cpp ${cuda_dir}/ops/fusion.cpp ${cuda_dir}/ops/conv_pool.cpp
    ${cuda_dir}/ops/gemm.cpp ${cuda_dir}/ops/conv.cpp ${cuda_dir}/ops/conv_graph.cpp
    ${cuda_dir}/ops/conv_algo_cache.cpp
    ${cuda_dir}/ops/igemm_conv.cpp)
  # The emulator's cuda_runtime.h, cuda_fp16.h, ... come first: no CUDA toolkit header is used.
  target_include_directories(${plugin} BEFORE PRIVATE ${emu_dir}/include)
  target_include_directories(${plugin} PRIVATE ${cuda_dir})
  target_link_libraries(${plugin} PRIVATE ${rt})
  # The emulated device is an H100 (compute capability 9.0): the wgmma candidates are built and
  # registered, as in a plugin built for sm_90.
  target_compile_definitions(${plugin} PRIVATE PLEXUS_CUDA_EMU=1 PLEXUS_CUDA_WGMMA=1)
  set_target_properties(${plugin} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "plexus-cuda"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${dir})
  target_link_options(${plugin} PRIVATE -Wl,--no-undefined)
  # The CPU plugin (the reference) and the MPI communicator (NCCL's bootstrap) beside it.
  foreach(other plexus_plugin_cpu plexus_plugin_mpi)
    if(TARGET ${other})
      add_custom_command(TARGET ${plugin} POST_BUILD
        COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_FILE:${other}>
                ${dir}/$<TARGET_FILE_NAME:${other}>)
      add_dependencies(${plugin} ${other})
    endif()
  endforeach()
  add_dependencies(plexus_tests ${plugin})
endfunction()

plexus_emu_variant("" ${PLEXUS_EMU_PLUGIN_DIR} "")

# The NCCL communicator plugin on the emulator's one-rank NCCL (include/nccl.h).
add_library(plexus_plugin_nccl_emu MODULE ${PROJECT_SOURCE_DIR}/plugins/nccl/nccl.cpp)
target_link_libraries(plexus_plugin_nccl_emu PRIVATE plexus_cuda_emu_runtime)
set_target_properties(plexus_plugin_nccl_emu PROPERTIES
  PREFIX "lib"
  OUTPUT_NAME "plexus-nccl"
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LIBRARY_OUTPUT_DIRECTORY ${PLEXUS_EMU_PLUGIN_DIR})
target_link_options(plexus_plugin_nccl_emu PRIVATE -Wl,--no-undefined)
add_dependencies(plexus_tests plexus_plugin_nccl_emu)

# The emulator's own checks: barriers, shuffles, launch limits, capture, the sort.
set(selftest_cpp ${CMAKE_CURRENT_BINARY_DIR}/emu/selftest.cpp)
add_custom_command(OUTPUT ${selftest_cpp}
  COMMAND ${Python3_EXECUTABLE} ${emu_dir}/translate.py ${emu_dir}/selftest.cu ${selftest_cpp}
  DEPENDS ${emu_dir}/translate.py ${emu_dir}/selftest.cu
  COMMENT "CUDA emulator: translating selftest.cu")
add_executable(plexus_cuda_emu_selftest ${selftest_cpp})
target_link_libraries(plexus_cuda_emu_selftest PRIVATE plexus_cuda_emu_runtime)
add_dependencies(plexus_tests plexus_cuda_emu_selftest)
add_test(NAME "cuda emulator: its barriers, shuffles, launch checks and capture"
  COMMAND plexus_cuda_emu_selftest)

# A test that is one .cu file of kernels and their checks (tests/cuda/NAME.cu) of device.cuh's
# helpers, translated for the emulator into the executable plexus_cuda_NAME.
function(plexus_emu_kernel_test name)
  set(cpp ${CMAKE_CURRENT_BINARY_DIR}/emu/${name}.cpp)
  set(cu ${PROJECT_SOURCE_DIR}/tests/cuda/${name}.cu)
  add_custom_command(OUTPUT ${cpp}
    COMMAND ${Python3_EXECUTABLE} ${emu_dir}/translate.py ${cu} ${cpp}
    DEPENDS ${emu_dir}/translate.py ${cu} ${cuda_dir}/device.cuh
    COMMENT "CUDA emulator: translating ${name}.cu")
  add_executable(plexus_cuda_${name} ${cpp})
  target_include_directories(plexus_cuda_${name} BEFORE PRIVATE ${emu_dir}/include)
  target_include_directories(plexus_cuda_${name} PRIVATE ${cuda_dir})
  target_compile_definitions(plexus_cuda_${name} PRIVATE PLEXUS_CUDA_EMU=1)
  target_link_libraries(plexus_cuda_${name} PRIVATE plexus_cuda_emu_runtime)
  add_dependencies(plexus_tests plexus_cuda_${name})
endfunction()

# split_sum (plugins/cuda/device.cuh), the in-launch finish of the plugin's split reductions, as
# a kernel of its own: its order bit for bit, one finishing block and counters left zero, with
# the blocks of each grid run forward, in reverse and shuffled.
plexus_emu_kernel_test(split_sum_test)
foreach(order forward reverse shuffle)
  add_test(NAME "cuda emulator: split_sum adds the slices in its fixed order, blocks ${order}"
    COMMAND ${CMAKE_COMMAND} -E env PLEXUS_EMU_BLOCKS=${order} $<TARGET_FILE:plexus_cuda_split_sum_test>)
endforeach()

# FastDiv (plugins/cuda/device.cuh), the 32-bit division by a fixed divisor of the pool
# kernels' index math, against `/` and `%` at the edges of its range.
plexus_emu_kernel_test(fast_div_test)
add_test(NAME "cuda emulator: FastDiv quotients and remainders equal the divide and modulo operators"
  COMMAND plexus_cuda_fast_div_test)

# Adds "cuda emulator[, LABEL]: TEST" for each test after TESTS: plexus_tests running that test
# against the plugins in PLUGIN_DIR (the emulated plugin's folder unless given), with the
# environment assignments after ENV. (One test a process: a skipped test would turn a whole-suite
# run into a skip.)
function(plexus_emu_tests label)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PLUGIN_DIR" "ENV;TESTS")
  if(NOT arg_PLUGIN_DIR)
    set(arg_PLUGIN_DIR ${PLEXUS_EMU_PLUGIN_DIR})
  endif()
  set(prefix "cuda emulator")
  if(label)
    set(prefix "cuda emulator, ${label}")
  endif()
  foreach(t ${arg_TESTS})
    add_test(NAME "${prefix}: ${t}"
      COMMAND ${CMAKE_COMMAND} -E env PLEXUS_TEST_PLUGIN_DIR=${arg_PLUGIN_DIR} ${arg_ENV}
              $<TARGET_FILE:plexus_tests> ${t})
    set_tests_properties("${prefix}: ${t}" PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
endfunction()

# The CUDA tests, against the emulated plugin.
plexus_emu_tests("" TESTS
    "cuda ops match the cpu reference"
    "every cuda tensor core gemm candidate matches the cpu"
    "the cuda simt gemm candidate takes every gemm the tiles decline and matches the cpu"
    "every cuda wgmma gemm candidate matches the cpu"
    "a linear -> relu group given to a wgmma candidate runs with the relu in its epilogue"
    "cuda igemm convolution candidates match the cpu reference"
    "cuda igemm convolution candidates are deterministic"
    "cuda igemm convolution candidates decline what they do not handle"
    "cuda cudnn_graph convolutions match the cpu reference in every layout mix"
    "cuda cudnn_graph convolutions run tensors that are not 16-byte aligned"
    "cuda cudnn_graph convolutions keep to the engines their op and options allow"
    "a conv2d -> relu pair given to cudnn_graph runs as one fused graph"
    "cuda direct convolutions match the cpu reference in every layout mix"
    "cuda direct convolutions are deterministic"
    "cuda direct convolutions decline what they do not handle"
    "the relu backward of a first layer with its bias sum and weight gradient runs as one direct kernel"
    "a first layer with its relu and max pool runs as one direct kernel with the unfused bits"
    "a conv with its relu and 2x2 max pool runs as one igemm kernel with the unfused bits"
    "a conv with its relu and 2x2 max pool runs as one igemm kernel on every tile"
    "the max pool backward of a first layer with its weight and bias gradients runs as one direct kernel"
    "cuda direct backward data of small convolutions matches the cpu in every layout mix"
    "cuda direct small convolutions decline what they do not handle"
    "cuda direct convolutions of small layers match the cpu in every layout mix"
    "a small conv with its relu and max pool runs as one direct kernel with the unfused bits"
    "the max pool backward of a small conv and its three gradients run as one direct kernel"
    "cuda max-pool kernels match the cpu in every layout mix"
    "cuda max-pool kernels decline strides that are neither nchw nor channels-last"
    "the classifier head fused on cuda matches the cpu"
    "the cuda multi-tensor unscale and check sees a non-finite gradient in any block launch after launch"
    "conv + max-pool fused on cuda matches the cpu"
    "a small cnn's whole step fused on cuda matches the cpu"
    "a small cnn's fused step reports a label out of range"
    "conv2d -> relu fused on cuda is one cudnn call where cudnn takes it"
    "a layer -> relu pair given to our own kernel runs with the relu in its epilogue"
    "a linear -> gelu pair on cuda runs as one of our gemms with the gelu in its epilogue"
    "a cuda training step of an mlp with gelus runs each linear -> gelu as one kernel"
    "a 16-bit cuda step keeps its conv activations channels-last and computes the nchw step"
    "a 16-bit cuda convnet step keeps its activations channels-last up to the classifier and computes the nchw step"
    "a 16-bit cuda simplecnn step keeps its pooled activation channels-last and computes the nchw step"
    "a 16-bit cuda step with a relu after its pool keeps the pool's side channels-last and computes the nchw step"
    "an f32 cuda step with the f32_channels_last option keeps its activations channels-last and computes the nchw step"
    "a native cuda training step of simplecnn or convnet runs no library kernel"
    "relu_backward with its sum over rows fused on cuda matches the cpu"
    "gelu_backward with its sum over rows fused on cuda matches the cpu"
    "a fused cuda training step matches the step node by node"
    "a cuda convnet training step matches the cpu step"
    "every node of a cuda convnet training step matches the cpu op on its inputs"
    "a captured cuda training step replays like the uncaptured one"
    "a cuda step captures each slot's copies around it in a graph of its own"
    "a fused cuda bf16 step runs its casts as multi-tensor kernels"
    "a fused cuda f16 step unscales and checks its gradients in one kernel"
    "a fused cuda f16 adamw step moves its loss scale and step count after every block has read them"
    "nccl single rank: every collective, op and dtype, exact"
    "nccl single rank: bench_native runs each collective, with the right results"
    "nccl single rank: count 0, send/recv to itself in a group, barriers"
    "nccl refuses overlapping buffers NCCL cannot handle, and stays usable"
    "nccl abort: later operations fail with aborted, destroy still works"
    "gradient buckets on a cuda communication stream leave a one-rank step unchanged"
    "a 16-bit cuda step all-reduces its gradients between their casts and their readers")

# The op suite again on the plugin's own kernels first (the test runtime's backend.kernels): the
# mma.sync GEMMs take the f16 and bf16 matmul and linear cases they accept, the implicit-GEMM
# convolutions those convolutions, instead of the stand-ins for cuBLASLt and cuDNN.
add_test(NAME "cuda emulator, native kernels: cuda ops match the cpu reference"
  COMMAND ${CMAKE_COMMAND} -E env PLEXUS_TEST_PLUGIN_DIR=${PLEXUS_EMU_PLUGIN_DIR}
          PLEXUS_TEST_KERNELS=native $<TARGET_FILE:plexus_tests> "cuda ops match the cpu reference")
set_tests_properties("cuda emulator, native kernels: cuda ops match the cpu reference" PROPERTIES
  SKIP_RETURN_CODE 77 TIMEOUT 900)

# The kernels again with each warp running as far ahead as CUDA allows (PLEXUS_EMU_SCHEDULE):
# a result that changes is a race on memory another warp writes without a barrier between; and
# with the blocks of each grid in a shuffled order (PLEXUS_EMU_BLOCKS), so that a block reading
# what another writes, or a "last block" that is only the highest-numbered one, shows. There
# cp.async and TMA copies land when they are issued (PLEXUS_EMU_CP_ASYNC=early), so a copy into a
# pipeline stage that a warp behind (or a wgmma not yet retired) still reads changes what it
# reads; in the runs above they land at their wait, so a stage read before its wait reads old
# bytes.
plexus_emu_tests("warps drifting apart"
  ENV PLEXUS_EMU_SCHEDULE=ahead PLEXUS_EMU_CP_ASYNC=early PLEXUS_EMU_BLOCKS=shuffle
  TESTS
    "cuda ops match the cpu reference"
    "the classifier head fused on cuda matches the cpu"
    "conv + max-pool fused on cuda matches the cpu"
    "a small cnn's whole step fused on cuda matches the cpu"
    "relu_backward with its sum over rows fused on cuda matches the cpu"
    "gelu_backward with its sum over rows fused on cuda matches the cpu"
    "the cuda multi-tensor unscale and check sees a non-finite gradient in any block launch after launch"
    "every cuda tensor core gemm candidate matches the cpu"
    "every cuda wgmma gemm candidate matches the cpu"
    "cuda igemm convolution candidates match the cpu reference"
    "cuda direct convolutions match the cpu reference in every layout mix"
    "the max pool backward of a first layer with its weight and bias gradients runs as one direct kernel"
    "cuda direct backward data of small convolutions matches the cpu in every layout mix"
    "the max pool backward of a small conv and its three gradients run as one direct kernel"
    "cuda direct convolutions of small layers match the cpu in every layout mix"
    "a small conv with its relu and max pool runs as one direct kernel with the unfused bits"
    "cuda max-pool kernels match the cpu in every layout mix")

# The Hopper GEMM again with warps running ahead but copies landing at their wait: a consumer
# warp that passes a stage's parity wait before the producer has even issued that fill (the
# ping-pong tile's warp groups skip each other's stages, and a parity alone cannot tell a
# stage's fill from the one two fills earlier) reads a stage no copy has written. (With copies
# landing at issue, the producer's first fills have landed before any consumer runs.)
plexus_emu_tests("warps drifting apart, copies at their wait"
  ENV PLEXUS_EMU_SCHEDULE=ahead PLEXUS_EMU_BLOCKS=shuffle
  TESTS
    "every cuda wgmma gemm candidate matches the cpu")

# The kernels whose grids follow the SM count (split-K GEMMs, weight gradients, bias sums: each
# finished by split_sum in the launch) again on an emulated device of 37 SMs, blocks shuffled:
# more slices than the 4-SM default makes (up to a few hundred), so both of split_sum's levels
# and its uneven last group run in every one of them.
plexus_emu_tests("37 SMs" ENV PLEXUS_EMU_SMS=37 PLEXUS_EMU_BLOCKS=shuffle TESTS
    "every cuda tensor core gemm candidate matches the cpu"
    "every cuda wgmma gemm candidate matches the cpu"
    "cuda direct convolutions match the cpu reference in every layout mix"
    "the relu backward of a first layer with its bias sum and weight gradient runs as one direct kernel"
    "the max pool backward of a first layer with its weight and bias gradients runs as one direct kernel"
    "conv + max-pool fused on cuda matches the cpu"
    "relu_backward with its sum over rows fused on cuda matches the cpu"
    "gelu_backward with its sum over rows fused on cuda matches the cpu"
    "the classifier head fused on cuda matches the cpu")

# The image-by-image kernels (ops/direct_small.cu, and the first layer's unpooling weight
# gradient in ops/direct_conv.cu) on one emulated SM: their blocks then loop over several images
# each (on four SMs the test batches give most blocks one image).
plexus_emu_tests("1 SM" ENV PLEXUS_EMU_SMS=1 PLEXUS_EMU_BLOCKS=shuffle TESTS
    "the max pool backward of a first layer with its weight and bias gradients runs as one direct kernel"
    "cuda direct backward data of small convolutions matches the cpu in every layout mix"
    "the max pool backward of a small conv and its three gradients run as one direct kernel"
    "a small conv with its relu and max pool runs as one direct kernel with the unfused bits")

# The communicator conformance suite over the emulator's NCCL, one rank, bootstrapped over MPI.
if(TARGET plexus_plugin_mpi)
  add_test(NAME "cuda emulator: nccl communicator conformance on 1 rank"
    COMMAND ${CMAKE_COMMAND} -E env PLEXUS_TEST_PLUGIN_DIR=${PLEXUS_EMU_PLUGIN_DIR}
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe --allow-run-as-root
            $<TARGET_FILE:plexus_comm_conformance> --comm nccl --backend cuda --bootstrap mpi)
  set_tests_properties("cuda emulator: nccl communicator conformance on 1 rank" PROPERTIES
    SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()

# The emulator's memcheck: the same plugin under AddressSanitizer, so a kernel reading or writing
# past a __shared__ array, the dynamic shared memory or a device allocation is stopped with the
# line (the test binary stays uninstrumented; libasan is preloaded). Where GCC has libasan.
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
  OUTPUT_VARIABLE plexus_libasan OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND plexus_libasan AND EXISTS "${plexus_libasan}")
  set(PLEXUS_EMU_ASAN_DIR ${PROJECT_BINARY_DIR}/emu-asan-plugins)
  plexus_emu_variant(_asan ${PLEXUS_EMU_ASAN_DIR} "-fsanitize=address;-fno-omit-frame-pointer")
  plexus_emu_tests("memcheck" PLUGIN_DIR ${PLEXUS_EMU_ASAN_DIR}
    ENV LD_PRELOAD=${plexus_libasan} ASAN_OPTIONS=detect_leaks=0
    TESTS
      "cuda ops match the cpu reference"
      "the classifier head fused on cuda matches the cpu"
      "conv + max-pool fused on cuda matches the cpu"
      "a small cnn's whole step fused on cuda matches the cpu"
      "conv2d -> relu fused on cuda is one cudnn call where cudnn takes it"
      "relu_backward with its sum over rows fused on cuda matches the cpu"
      "gelu_backward with its sum over rows fused on cuda matches the cpu"
      "the cuda multi-tensor unscale and check sees a non-finite gradient in any block launch after launch"
      "a 16-bit cuda step keeps its conv activations channels-last and computes the nchw step"
      "cuda max-pool kernels match the cpu in every layout mix"
      "cuda direct convolutions match the cpu reference in every layout mix"
      "cuda cudnn_graph convolutions match the cpu reference in every layout mix"
      "cuda cudnn_graph convolutions run tensors that are not 16-byte aligned"
      "a first layer with its relu and max pool runs as one direct kernel with the unfused bits"
      "a conv with its relu and 2x2 max pool runs as one igemm kernel with the unfused bits"
      "a conv with its relu and 2x2 max pool runs as one igemm kernel on every tile"
      "the max pool backward of a first layer with its weight and bias gradients runs as one direct kernel"
      "cuda direct backward data of small convolutions matches the cpu in every layout mix"
      "the max pool backward of a small conv and its three gradients run as one direct kernel"
      "cuda direct convolutions of small layers match the cpu in every layout mix"
      "a small conv with its relu and max pool runs as one direct kernel with the unfused bits"
      "every cuda tensor core gemm candidate matches the cpu"
      "the cuda simt gemm candidate takes every gemm the tiles decline and matches the cpu"
      "every cuda wgmma gemm candidate matches the cpu"
      "a linear -> gelu pair on cuda runs as one of our gemms with the gelu in its epilogue")
  # The igemm match test, the suite's longest under memcheck (519 s of a 40-minute CI run), in
  # bf16 and f32 only: its f16 kernels are the bf16 ones' templates with the same element size,
  # so they address memory the same way; the unchecked runs above cover f16's values.
  plexus_emu_tests("memcheck" PLUGIN_DIR ${PLEXUS_EMU_ASAN_DIR}
    ENV LD_PRELOAD=${plexus_libasan} ASAN_OPTIONS=detect_leaks=0 PLEXUS_TEST_DTYPES=bf16,f32
    TESTS "cuda igemm convolution candidates match the cpu reference")
  # The suite's longest test (about 300 s): started first, so that the others fill the other
  # core beside it rather than leave it idle at the end (a fresh build has no ctest cost data).
  set_tests_properties("cuda emulator, memcheck: cuda igemm convolution candidates match the cpu reference"
    PROPERTIES COST 300)
endif()

# A test of plexus runs on the emulated plugin, a script run from the source tree as
# `bash SCRIPT PLEXUS EMU_PLUGIN_DIR WORKDIR`, passing when its output matches PASS.
function(plexus_emu_run_test name script workdir pass timeout)
  add_test(NAME "${name}"
    COMMAND bash ${emu_dir}/${script} $<TARGET_FILE:plexus> ${PLEXUS_EMU_PLUGIN_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/${workdir}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties("${name}" PROPERTIES PASS_REGULAR_EXPRESSION "${pass}" TIMEOUT ${timeout})
endfunction()

# The tuner and the plugin's fused kernels: simplecnn's whole-step kernel, which runs every node
# with its own code (PLX_KERNEL_SELF_CONTAINED), made once from a fresh cache and from the cache,
# with no member kernels reported; the parts' groups still tuned as a whole. (Two members of one
# name and op, the linear's gradient matmuls, are tests/core/test_tune.cpp's, on the test plugin.)
plexus_emu_run_test("cuda emulator: the whole-step kernel is made once and reports no member kernels"
  group_tuning_on_emulator.sh emu-group-tuning "a self-contained fused kernel is made once" 600)

# A driver that refuses the captured step's programmatic launches (the emulator's
# PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS): plexus says what failed and what avoids it, the option
# does, and run_owed.sh's retry (tests/gpu/run_lib.sh) takes it for the rest of a GPU call.
plexus_emu_run_test("cuda emulator: a refused capture of programmatic launches names the option that avoids it, and run_owed.sh retries with it"
  capture_refused.sh emu-capture-refused
  "a refused capture names its way round, and run_owed.sh takes it" 300)

# The Tensor Core kernels' shared-memory requests (PLEXUS_EMU_ACCESS): one wavefront each for
# their ldmatrix reads and 16-byte copies, on every tile (the igemm match test in bf16 and f32
# and the GEMM candidates, counted: about 170 s, so started early as the other long ones are).
add_test(NAME "cuda emulator: the tensor core kernels' ldmatrix reads and 16-byte copies take one shared-memory wavefront a request"
  COMMAND bash ${emu_dir}/access_counts.sh $<TARGET_FILE:plexus_tests> ${PLEXUS_EMU_PLUGIN_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/emu-access
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties("cuda emulator: the tensor core kernels' ldmatrix reads and 16-byte copies take one shared-memory wavefront a request"
  PROPERTIES PASS_REGULAR_EXPRESSION "one shared-memory wavefront a request" SKIP_RETURN_CODE 77
  TIMEOUT 900 COST 170)

# The trainer end to end on the emulated plugin (resident data, capture, fusion, checkpoints)
# against the CPU, and in bf16 and f16.
add_test(NAME "cuda emulator: plexus train on the emulated cuda plugin follows the cpu"
  COMMAND bash ${emu_dir}/train_on_emulator.sh $<TARGET_FILE:plexus>
          $<TARGET_FILE:plexus_compare_runs> ${PLEXUS_EMU_PLUGIN_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/emu-train
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties("cuda emulator: plexus train on the emulated cuda plugin follows the cpu"
  PROPERTIES PASS_REGULAR_EXPRESSION "trains on the emulator as on the cpu" TIMEOUT 900
  COST 240)  # the second longest (about 240 s), started early as the memcheck's igemm test is

# A kernel that faults on the device (the emulator's sticky faults, PLEXUS_EMU_FAULT_KERNEL): the
# plugin's error points to backend.check_kernels, which names a kernel that is not timed; the
# tuner names a candidate that faults; run_owed.sh's reruns (tests/gpu/run_lib.sh) get a GPU
# call's runs through both with the kernels kept out.
plexus_emu_run_test("cuda emulator: a kernel that faults is named, by the tuner or by backend.check_kernels, and run_owed.sh keeps it out"
  kernel_fault.sh emu-kernel-fault "a faulting kernel is named and kept out" 300)
