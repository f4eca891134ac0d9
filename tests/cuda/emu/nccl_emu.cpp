// The CUDA emulator's one-rank NCCL (include/nccl.h).
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "nccl.h"

struct ncclComm {
  int rank = 0, nranks = 1;
  ncclResult_t async = ncclSuccess;  // the state ncclCommGetAsyncError reports
  std::string last_error;
};

namespace {

// For ncclGetLastError(nullptr); a buffer without a destructor, as the SDK's, so that a call
// failing in a static's teardown at exit does not write into a freed string.
thread_local char g_last_error[4096];

ncclResult_t fail(ncclComm* c, ncclResult_t r, const std::string& why) {
  std::snprintf(g_last_error, sizeof g_last_error, "%s", why.c_str());
  if (c) c->last_error = why;
  return r;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// A group's operations, run at the outermost ncclGroupEnd; send/recv pairs matched there.
struct P2p {
  bool send;
  const void* src;
  void* dst;
  size_t bytes;
  int peer;
  cudaStream_t stream;
  ncclComm* comm;
};
thread_local int g_depth = 0;
thread_local std::vector<std::function<ncclResult_t()>> g_ops;
thread_local std::vector<P2p> g_p2p;

ncclResult_t submit(cudaStream_t s, std::function<void()> work, const char* what) {
  if (plx_emu::submit_work(s, std::move(work), what) != cudaSuccess) return ncclUnhandledCudaError;
  return ncclSuccess;
}

ncclResult_t check(ncclComm* c, const void* send, const void* recv, size_t count,
                   ncclDataType_t t, const char* what) {
  if (!c) return fail(nullptr, ncclInvalidArgument, std::string(what) + ": null communicator");
  if (type_size(t) == 0) return fail(c, ncclInvalidArgument, std::string(what) + ": bad data type");
  if (count && (!send || !recv)) return fail(c, ncclInvalidArgument, std::string(what) + ": null buffer");
  return ncclSuccess;
}

// One rank: every collective's result is this rank's own data.
ncclResult_t copy_op(ncclComm* c, const void* send, void* recv, size_t count, ncclDataType_t t,
                     cudaStream_t s, const char* what) {
  if (const ncclResult_t r = check(c, send, recv, count, t, what); r != ncclSuccess) return r;
  const size_t bytes = count * type_size(t);
  auto op = [=] {
    if (!bytes || send == recv) return ncclSuccess;
    return submit(s, [=] { std::memmove(recv, send, bytes); }, what);
  };
  if (g_depth > 0) {
    g_ops.push_back(op);
    return ncclSuccess;
  }
  return op();
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& ch : id->internal) ch = static_cast<char>(rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t* config) {
  *comm = nullptr;
  if (nranks != 1 || rank != 0)
    return fail(nullptr, ncclInvalidUsage,
                "the CUDA emulator's NCCL has one rank (asked for rank " + std::to_string(rank) +
                    " of " + std::to_string(nranks) + ")");
  auto* c = new ncclComm;
  *comm = c;
  // Non-blocking creation returns at once; the state says when the rank has joined.
  if (config && config->blocking == 0) {
    c->async = ncclSuccess;
    return ncclInProgress;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: null communicator");
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm) return ncclInvalidArgument;
  *state = comm->async;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t comm) {
  return comm ? comm->last_error.c_str() : g_last_error;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op < ncclSum || op >= ncclNumOps) return fail(comm, ncclInvalidArgument, "ncclAllReduce: bad op");
  return copy_op(comm, send, recv, count, type, stream, "ncclAllReduce");
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (root != 0) return fail(comm, ncclInvalidArgument, "ncclBroadcast: root out of range");
  return copy_op(comm, send, recv, count, type, stream, "ncclBroadcast");
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return copy_op(comm, send, recv, sendcount, type, stream, "ncclAllGather");
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (op < ncclSum || op >= ncclNumOps)
    return fail(comm, ncclInvalidArgument, "ncclReduceScatter: bad op");
  return copy_op(comm, send, recv, recvcount, type, stream, "ncclReduceScatter");
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (const ncclResult_t r = check(comm, buf, buf, count, type, "ncclSend"); r != ncclSuccess) return r;
  if (peer != 0) return fail(comm, ncclInvalidArgument, "ncclSend: peer out of range");
  if (g_depth == 0)
    return fail(comm, ncclInvalidUsage, "ncclSend to itself outside a group would wait forever");
  g_p2p.push_back({true, buf, nullptr, count * type_size(type), peer, stream, comm});
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (const ncclResult_t r = check(comm, buf, buf, count, type, "ncclRecv"); r != ncclSuccess) return r;
  if (peer != 0) return fail(comm, ncclInvalidArgument, "ncclRecv: peer out of range");
  if (g_depth == 0)
    return fail(comm, ncclInvalidUsage, "ncclRecv from itself outside a group would wait forever");
  g_p2p.push_back({false, nullptr, buf, count * type_size(type), peer, stream, comm});
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++g_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0) return ncclSuccess;
  std::vector<std::function<ncclResult_t()>> ops;
  ops.swap(g_ops);
  std::vector<P2p> p2p;
  p2p.swap(g_p2p);
  ncclResult_t result = ncclSuccess;
  for (auto& op : ops)
    if (const ncclResult_t r = op(); r != ncclSuccess && result == ncclSuccess) result = r;
  // Sends and receives to itself pair up in order; their sizes must agree.
  std::deque<P2p> sends, recvs;
  for (const P2p& p : p2p) (p.send ? sends : recvs).push_back(p);
  while (!sends.empty() && !recvs.empty()) {
    const P2p s = sends.front(), r = recvs.front();
    sends.pop_front(), recvs.pop_front();
    if (s.bytes != r.bytes) {
      result = fail(s.comm, ncclInvalidUsage, "ncclSend and ncclRecv to itself differ in size");
      continue;
    }
    if (s.bytes) {
      // The receive's stream gets the copy, after the send's stream has reached the send: on
      // the emulator both are already there (streams run at once), and captured streams record
      // it on the receiving one.
      if (submit(r.stream, [s, r] { std::memmove(r.dst, s.src, s.bytes); }, "ncclRecv") != ncclSuccess)
        result = ncclUnhandledCudaError;
    }
  }
  if (!sends.empty() || !recvs.empty()) {
    // NCCL would wait for the peer forever; the emulator says so instead.
    const P2p& p = sends.empty() ? recvs.front() : sends.front();
    std::fprintf(stderr, "nccl emulator: an unmatched %s to itself in a group would wait forever\n",
                 p.send ? "send" : "receive");
    result = fail(p.comm, ncclInvalidUsage, "an unmatched send or receive in a group");
  }
  return result;
}
