// The CUDA emulator has no cuDNN (see cublasLt.h).
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

typedef enum {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_ALLOC_FAILED = 2001,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
} cudnnStatus_t;
struct cudnnContext;
typedef cudnnContext* cudnnHandle_t;

inline const char* cudnnGetErrorString(cudnnStatus_t s) {
  return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_NOT_SUPPORTED";
}
inline void cudnnGetLastErrorString(char* buf, size_t n) {
  if (n) buf[0] = 0;
}
inline cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  *h = nullptr;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnDestroy(cudnnHandle_t) { return CUDNN_STATUS_SUCCESS; }
