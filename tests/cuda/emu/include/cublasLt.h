// The CUDA emulator has no cuBLAS: the handle type and status names the plugin's shared code
// refers to, and a handle that creates. Kernels that need cuBLASLt are not built into the
// emulated plugin (tests/cuda/emu/stubs.cpp registers the GEMMs of the emulator instead).
#pragma once

#include "cuda_runtime.h"

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;

inline const char* cublasGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
inline const char* cublasGetStatusString(cublasStatus_t) { return "the CUDA emulator has no cuBLAS"; }
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
