// The CUDA emulator's cuBLASLt (include/cublasLt.h): the documented semantics of the calls the
// plugin makes, so ops/gemm.cpp runs as written. It is a model of the API, not of its kernels:
// every argument is checked as the library documents it (layout sizes against the transposes,
// leading dimensions, batch counts, attribute sizes, the bias type, the alignment an algorithm
// was chosen for, its workspace), and the product is computed on the host in f32 with one
// rounding to D's type; a call with an epilogue sums K in another order than one without.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cublasLt.h"
#include "plx_emu_numeric.hpp"

struct cublasLtContext {
  int live = 1;
};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // unset: D's type
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: the library's defaults
};

namespace {

constexpr uint64_t kAlgoMagic = 0x706c78656d756c74ull;  // "plxemult"
// The emulated algorithms: a split-K one that wants this much workspace when K is long, and one
// that needs none.
constexpr size_t kSplitWorkspace = size_t{1} << 20;
constexpr uint64_t kSplitMinK = 512;

size_t type_size(int32_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

plx_emu::Elem elem(int32_t t) {
  return t == CUDA_R_32F ? plx_emu::Elem::kF32
         : t == CUDA_R_16F ? plx_emu::Elem::kF16
                           : plx_emu::Elem::kBF16;
}

cublasStatus_t invalid(const std::string& why) {
  std::fprintf(stderr, "cuda emulator: cuBLASLt: %s\n", why.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t unsupported(const std::string& why) {
  std::fprintf(stderr, "cuda emulator: cuBLASLt: %s\n", why.c_str());
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

template <class T>
cublasStatus_t take(T& dst, const void* buf, size_t size, const char* what) {
  if (!buf || size != sizeof(T))
    return invalid(std::string(what) + ": " + std::to_string(size) + " bytes given, " +
                   std::to_string(sizeof(T)) + " expected");
  std::memcpy(&dst, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS; }
bool has_relu(uint32_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }

// The problem the descriptors describe: op(A) (m, k), op(B) (k, n), C and D (m, n).
struct Problem {
  uint64_t m = 0, n = 0, k = 0;
  int32_t batch = 1;
};
cublasStatus_t check(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Problem& p) {
  if (!op || !a || !b || !c || !d) return invalid("a descriptor is null");
  if (op->scale != CUDA_R_32F) return unsupported("the scale type must be CUDA_R_32F here");
  if (a->type != b->type) return unsupported("A and B have different types");
  if (c->type != d->type) return unsupported("C and D have different types");
  if (a->type != d->type) return unsupported("A and D have different types");
  if (op->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type != CUDA_R_32F)
    return unsupported("CUBLAS_COMPUTE_32F_FAST_TF32 takes f32 operands");
  if (op->compute != CUBLAS_COMPUTE_32F && op->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return unsupported("compute type " + std::to_string(op->compute));
  const uint64_t am = op->transa == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t ak = op->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t bk = op->transb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t bn = op->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (ak != bk)
    return invalid("op(A) is " + std::to_string(am) + " x " + std::to_string(ak) + " but op(B) is " +
                   std::to_string(bk) + " x " + std::to_string(bn));
  if (c->rows != am || c->cols != bn || d->rows != am || d->cols != bn)
    return invalid("C/D is " + std::to_string(d->rows) + " x " + std::to_string(d->cols) +
                   ", op(A) op(B) is " + std::to_string(am) + " x " + std::to_string(bn));
  if (a->batch != b->batch || a->batch != c->batch || a->batch != d->batch)
    return invalid("the batch counts of A, B, C and D differ");
  if (has_bias(op->epilogue)) {
    const int32_t bt = op->bias_type < 0 ? d->type : op->bias_type;
    if (bt != d->type) return unsupported("the bias type differs from D's");
  }
  p.m = am, p.n = bn, p.k = ak, p.batch = a->batch;
  return CUBLAS_STATUS_SUCCESS;
}

uintptr_t alignment_of(const void* ptr) {
  const auto v = reinterpret_cast<uintptr_t>(ptr);
  return v == 0 ? uintptr_t{1} << 20 : v & (~v + 1);
}

}  // namespace

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_?";
}
const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "see the emulator's message on stderr";
}

// An attribute case that copies the caller's value into `field` (take's size check names it).
#define PLX_EMU_TAKE(attr, field) \
  case attr:                      \
    return take(field, buf, size, #attr)

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    PLX_EMU_TAKE(CUBLASLT_MATMUL_DESC_TRANSA, d->transa);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_DESC_TRANSB, d->transb);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_DESC_EPILOGUE, d->epilogue);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_DESC_BIAS_POINTER, d->bias);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, d->bias_type);
  }
  return invalid("matmul descriptor attribute " + std::to_string(attr) + " is not emulated");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  if (type_size(type) == 0) return unsupported("layout type " + std::to_string(type));
  // Column-major: a column of `rows` elements, columns `ld` apart.
  if (ld < 1 || static_cast<uint64_t>(ld) < rows)
    return invalid("a leading dimension of " + std::to_string(ld) + " for " +
                   std::to_string(rows) + " rows (column-major: ld >= rows)");
  *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
      const cublasStatus_t s = take(l->batch, buf, size, "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT");
      if (s == CUBLAS_STATUS_SUCCESS && l->batch < 1) return invalid("a batch count below 1");
      return s;
    }
    PLX_EMU_TAKE(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, l->stride);
  }
  return invalid("layout attribute " + std::to_string(attr) + " is not emulated");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new cublasLtMatmulPreferenceOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (!p) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    PLX_EMU_TAKE(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, p->max_workspace);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p->align[0]);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p->align[1]);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p->align[2]);
    PLX_EMU_TAKE(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p->align[3]);
  }
  return invalid("preference attribute " + std::to_string(attr) + " is not emulated");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!pref || !results || !returned || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  if (const cublasStatus_t s = check(op, a, b, c, d, p); s != CUBLAS_STATUS_SUCCESS) return s;
  // An algorithm may assume what the preferences promise: pointers aligned to the preferred
  // bytes (at least one element), and the bias pointer as aligned as the one in the descriptor.
  const size_t elem = type_size(a->type);
  for (uint32_t al : pref->align)
    if (al < elem || (al & (al - 1)) != 0)
      return invalid("a minimum alignment of " + std::to_string(al) + " bytes for " +
                     std::to_string(elem) + "-byte elements");
  const uint64_t bias_align = has_bias(op->epilogue)
                                  ? std::min<uint64_t>(alignment_of(op->bias), 16)
                                  : 0;
  *returned = 0;
  auto offer = [&](size_t workspace) {
    if (*returned >= requested) return;
    cublasLtMatmulHeuristicResult_t& r = results[*returned];
    std::memset(&r, 0, sizeof r);
    r.algo.data[0] = kAlgoMagic;
    r.algo.data[1] = workspace;
    for (int i = 0; i < 4; ++i) r.algo.data[2 + i] = pref->align[i];
    r.algo.data[6] = bias_align;
    r.workspaceSize = workspace;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    ++*returned;
  };
  if (p.k >= kSplitMinK && pref->max_workspace >= kSplitWorkspace) offer(kSplitWorkspace);
  offer(0);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  if (const cublasStatus_t s = check(op, a, b, c, d, p); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!alpha || !beta) return invalid("alpha or beta is null");
  if (!algo || algo->data[0] != kAlgoMagic)
    return invalid("the algorithm is not one the heuristic returned");
  const size_t ws_need = algo->data[1];
  if (ws_need > 0 && (!workspace || workspace_bytes < ws_need))
    return invalid("the algorithm needs " + std::to_string(ws_need) + " bytes of workspace, " +
                   std::to_string(workspace ? workspace_bytes : 0) + " given");
  const void* ptrs[4] = {A, B, C, D};
  const char* names = "ABCD";
  for (int i = 0; i < 4; ++i)
    if (alignment_of(ptrs[i]) < algo->data[2 + i])
      return unsupported(std::string("pointer ") + names[i] + " is less aligned than the " +
                         std::to_string(algo->data[2 + i]) +
                         " bytes the algorithm was chosen for");
  const bool bias = has_bias(op->epilogue);
  if (bias && (!op->bias || alignment_of(op->bias) < algo->data[6]))
    return unsupported("the bias pointer is null or less aligned than the algorithm was chosen for");
  if (C == D && (c->ld != d->ld || c->stride != d->stride || c->type != d->type))
    return invalid("in place (C == D) with different C and D layouts");
  // Host scalars are read at the call; the descriptor's fields too (its bias pointer may change
  // before the next call, as the plugin does per call).
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const cublasLtMatmulDescOpaque_t o = *op;
  const cublasLtMatrixLayoutOpaque_t la = *a, lb = *b, lc = *c, ld = *d;
  const bool tf = o.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const plx_emu::Elem ta = elem(la.type), td = elem(ld.type);  // A and B alike, C and D alike
  ::plx_emu::submit_library_call(stream, [=] {
    if (ws_need > 0) std::memset(workspace, 0xA5, ws_need);  // the algorithm's scratch
    for (int32_t z = 0; z < p.batch; ++z) {
      const int64_t oa = z * la.stride, ob = z * lb.stride, oc = z * lc.stride, od = z * ld.stride;
      for (uint64_t j = 0; j < p.n; ++j)
        for (uint64_t i = 0; i < p.m; ++i) {
          // A kernel with an epilogue is another kernel than the plain one: it sums K in
          // blocks of 32, each block's sum added to the total (the plain one in one run), so
          // their bits differ in the last place here and there, as cuBLASLt's do.
          float s = 0.0f, part = 0.0f;
          const uint64_t block = o.epilogue == CUBLASLT_EPILOGUE_DEFAULT ? p.k + 1 : 32;
          for (uint64_t kk = 0; kk < p.k; ++kk) {
            if (kk % block == 0) s += part, part = 0.0f;
            const int64_t ia = o.transa == CUBLAS_OP_N ? static_cast<int64_t>(i + kk * la.ld)
                                                       : static_cast<int64_t>(kk + i * la.ld);
            const int64_t ib = o.transb == CUBLAS_OP_N ? static_cast<int64_t>(kk + j * lb.ld)
                                                       : static_cast<int64_t>(j + kk * lb.ld);
            float x = plx_emu::load_elem(A, oa + ia, ta), y = plx_emu::load_elem(B, ob + ib, ta);
            if (tf) x = plx_emu::tf32_round(x), y = plx_emu::tf32_round(y);
            part += x * y;
          }
          s += part;
          float v = al * s;
          // beta = 0: C is not read (it may hold anything, NaN included).
          if (be != 0.0f) v += be * plx_emu::load_elem(C, oc + static_cast<int64_t>(i + j * lc.ld), td);
          if (bias) v += plx_emu::load_elem(o.bias, static_cast<int64_t>(i), td);
          if (has_relu(o.epilogue)) v = v > 0.0f ? v : 0.0f;  // NaN gives 0
          plx_emu::store_elem(D, od + static_cast<int64_t>(i + j * ld.ld), td, v);
        }
    }
  }, "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}
