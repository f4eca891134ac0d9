// The CUDA emulator's cuDNN: the legacy convolution API the plugin calls (ops/conv.cpp), with the
// documented semantics (cudnn_emu.cpp): 4-D tensor and filter descriptors in NCHW or NHWC,
// convolution descriptors with padding, stride, dilation and groups, the three convolutions with
// alpha and beta (y is not read when beta = 0), a few algorithms per direction that differ in
// workspace and determinism (the others are refused), the heuristic and the measuring Find*Ex,
// the fused convolution, bias and activation (RELU or IDENTITY) with its activation descriptor,
// and calls enqueued on the handle's stream.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

typedef enum {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_ALLOC_FAILED = 4000,
} cudnnStatus_t;

typedef enum {
  CUDNN_DATA_FLOAT = 0,
  CUDNN_DATA_DOUBLE = 1,
  CUDNN_DATA_HALF = 2,
  CUDNN_DATA_BFLOAT16 = 9,
} cudnnDataType_t;
typedef enum { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 } cudnnTensorFormat_t;
typedef enum { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
typedef enum {
  CUDNN_DEFAULT_MATH = 0,
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
  CUDNN_FMA_MATH = 3,
} cudnnMathType_t;
typedef enum { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 } cudnnDeterminism_t;
typedef enum { CUDNN_NOT_PROPAGATE_NAN = 0, CUDNN_PROPAGATE_NAN = 1 } cudnnNanPropagation_t;
typedef enum {
  CUDNN_ACTIVATION_SIGMOID = 0,
  CUDNN_ACTIVATION_RELU = 1,
  CUDNN_ACTIVATION_TANH = 2,
  CUDNN_ACTIVATION_CLIPPED_RELU = 3,
  CUDNN_ACTIVATION_ELU = 4,
  CUDNN_ACTIVATION_IDENTITY = 5,
  CUDNN_ACTIVATION_SWISH = 6,
} cudnnActivationMode_t;

typedef enum {
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
  CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2,
  CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
  CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
} cudnnConvolutionFwdAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6,
} cudnnConvolutionBwdDataAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7,
} cudnnConvolutionBwdFilterAlgo_t;

#define PLX_EMU_CUDNN_PERF(Algo) \
  struct {                       \
    Algo algo;                   \
    cudnnStatus_t status;        \
    float time;                  \
    size_t memory;               \
    cudnnDeterminism_t determinism; \
    cudnnMathType_t mathType;    \
    int reserved[3];             \
  }
typedef PLX_EMU_CUDNN_PERF(cudnnConvolutionFwdAlgo_t) cudnnConvolutionFwdAlgoPerf_t;
typedef PLX_EMU_CUDNN_PERF(cudnnConvolutionBwdDataAlgo_t) cudnnConvolutionBwdDataAlgoPerf_t;
typedef PLX_EMU_CUDNN_PERF(cudnnConvolutionBwdFilterAlgo_t) cudnnConvolutionBwdFilterAlgoPerf_t;
#undef PLX_EMU_CUDNN_PERF

struct cudnnContext;
struct cudnnTensorStruct;
struct cudnnFilterStruct;
struct cudnnConvolutionStruct;
struct cudnnActivationStruct;
typedef cudnnContext* cudnnHandle_t;
typedef cudnnActivationStruct* cudnnActivationDescriptor_t;
typedef cudnnTensorStruct* cudnnTensorDescriptor_t;
typedef cudnnFilterStruct* cudnnFilterDescriptor_t;
typedef cudnnConvolutionStruct* cudnnConvolutionDescriptor_t;

size_t cudnnGetVersion();
const char* cudnnGetErrorString(cudnnStatus_t s);
void cudnnGetLastErrorString(char* buf, size_t n);
cudnnStatus_t cudnnCreate(cudnnHandle_t* h);
cudnnStatus_t cudnnDestroy(cudnnHandle_t h);
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s);

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute);
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d);
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d);
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
                                           cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t relu_nan, double coef);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t conv,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wd);

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t conv,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t* bytes);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes);

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t conv,
                                                     cudnnTensorDescriptor_t y, int requested,
                                                     int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf);

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void* x, cudnnFilterDescriptor_t wd,
    const void* w, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t yd, void* y,
    int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* ws, size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void* w, cudnnTensorDescriptor_t dyd,
    const void* dy, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dxd, void* dx,
    int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* ws,
    size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void* x, cudnnTensorDescriptor_t dyd,
    const void* dy, cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dwd, void* dw,
    int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* ws,
    size_t ws_bytes);

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha,
                                      cudnnTensorDescriptor_t xd, const void* x,
                                      cudnnFilterDescriptor_t wd, const void* w,
                                      cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes,
                                      const void* beta, cudnnTensorDescriptor_t yd, void* y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha,
                                           cudnnFilterDescriptor_t wd, const void* w,
                                           cudnnTensorDescriptor_t dyd, const void* dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws,
                                           size_t ws_bytes, const void* beta,
                                           cudnnTensorDescriptor_t dxd, void* dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha,
                                             cudnnTensorDescriptor_t xd, const void* x,
                                             cudnnTensorDescriptor_t dyd, const void* dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws,
                                             size_t ws_bytes, const void* beta,
                                             cudnnFilterDescriptor_t dwd, void* dw);
// y = act(alpha1 * conv(x, w) + alpha2 * z + bias).
cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t h, const void* alpha1, cudnnTensorDescriptor_t xd, const void* x,
    cudnnFilterDescriptor_t wd, const void* w, cudnnConvolutionDescriptor_t conv,
    cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes, const void* alpha2,
    cudnnTensorDescriptor_t zd, const void* z, cudnnTensorDescriptor_t biasd, const void* bias,
    cudnnActivationDescriptor_t act, cudnnTensorDescriptor_t yd, void* y);
