// The CUDA emulator's runtime (tests/cuda/emu/README.md): fibers for CUDA threads, barriers and
// warp exchanges between them, and the runtime API on host memory with stream capture.
#include <fnmatch.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_runtime.h"
#include "plexus/sdk/dtype.hpp"
#include "plx_emu_tensormap.hpp"

// Under AddressSanitizer (the emulator's memcheck build, emu.cmake) every switch between stacks
// is announced, and a fiber's stack is unpoisoned before it is used again.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PLX_EMU_ASAN 1
#else
#define PLX_EMU_ASAN 0
#endif

// ---- fiber switch (x86-64 System V: the callee-saved registers on the old stack) ----
extern "C" void plx_emu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
asm(R"(
  .text
  .globl plx_emu_switch
  .hidden plx_emu_switch
  .type plx_emu_switch,@function
plx_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size plx_emu_switch, .-plx_emu_switch
)");
#else
#error "the CUDA emulator's fibers are written for x86-64"
#endif

thread_local dim3 blockDim{1, 1, 1};
thread_local dim3 gridDim{1, 1, 1};

namespace plx_emu {

thread_local Thread* g_thread = nullptr;
thread_local uint3 g_block_idx{0, 0, 0};

// Programmatic dependent launch (below): an access to device memory before the wait fails the
// launch naming `what`; whether p lies in an allocation of the runtime's.
[[noreturn]] void early_device_access(const char* what, const void* p);
bool device_memory(const void* p);

namespace {

constexpr size_t kStack = size_t{256} << 10;  // per CUDA thread; the pages are touched on use
constexpr int kMaxThreads = 1024;
constexpr size_t kSlot = 32;  // bytes a lane offers at a warp meeting (an mma's A and B fragments)
// The shared address of the launch's dynamic shared memory: aligned to 16 bytes and no more, so
// that a kernel needing more (the 1024-byte swizzle atoms of TMA and wgmma) must realign it.
constexpr uint32_t kSharedBase = 16;

int block_threads() {
  return static_cast<int>(::blockDim.x * ::blockDim.y * ::blockDim.z);
}

// A wgmma operand's shared-memory matrix descriptor, decoded (decode_desc, "Hopper PTX" below).
struct Desc {
  uint32_t start, lbo, sbo;
  bool mn_major;
  uint32_t span;  // the swizzle's row: 128, 64 or 32 bytes
};

// Thrown out of a launch when a block cannot go on (a deadlock, a trap, an error in a thread).
struct LaunchFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Fiber {
  Thread thread;
  void* sp = nullptr;
  void* asan_fake = nullptr;  // AddressSanitizer's fake stack while switched out
  bool done = false;
  bool waiting = false;  // parked at a barrier
  // In a kernel launched with programmatic stream serialization, until the thread calls
  // cudaGridDependencySynchronize: it may not touch device memory yet, nor exit (cp.async, TMA
  // loads and atomics ask through check_device_access).
  bool pdl_pending = false;
  const char* where = "";
  // barrier.cluster: whether the thread arrived and has not waited yet, and the generation of
  // the cluster barrier it arrived in.
  bool cluster_arrived = false;
  unsigned cluster_gen = 0;
};

// One block's fibers and barrier state; one per host thread that launches.
struct Block {
  std::vector<Fiber> fibers;
  char* stacks = nullptr;
  void* sched_sp = nullptr;
  Fiber* current = nullptr;
  const void* sched_bottom = nullptr;  // the scheduler's stack, for AddressSanitizer
  size_t sched_size = 0;
  const std::function<void()>* body = nullptr;
  bool programmatic = false;  // the grid was launched with programmatic stream serialization
  // Thread-block clusters: the block's rank in its cluster (%cluster_ctarank) and its index in
  // the grid; `exited` once all its threads have (a peer's remote access to it is then an
  // error).
  unsigned rank = 0;
  uint3 idx{0, 0, 0};
  bool exited = false;
  std::string fault;  // set by a thread that threw
  int live = 0;       // fibers not done
  bool progress = false;
  // __syncthreads: arrivals of this generation, the OR / count accumulator, per-generation results.
  int arrived = 0;
  unsigned gen = 0;
  int acc = 0;
  int result[2] = {0, 0};
  // Warps: arrival masks, generations, and two banks of 32 value slots each.
  struct Warp {
    unsigned arrived = 0, mask = 0, gen = 0;
    alignas(16) unsigned char slot[2][kWarp][kSlot];
    // mma.sync: per bank, the generation of the meeting whose D the warp has computed (if any
    // since the block began).
    unsigned mma_gen[2] = {0, 0};
    bool mma_done[2] = {false, false};
    unsigned exited = 0;  // the lanes whose threads have exited
  };
  std::vector<Warp> warps;
  std::vector<unsigned char> smem;  // dynamic shared memory
  // cp.async per thread: the copies issued since the last commit, and the committed groups not
  // yet waited for, oldest first (each copy's source bytes are read when it is issued).
  struct AsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
    int bytes;
  };
  struct Async {
    std::vector<AsyncCopy> open;
    std::deque<std::vector<AsyncCopy>> groups;
  };
  std::vector<Async> async;
  // PLEXUS_EMU_ACCESS: each thread's cp.async count in this block, and what each warp-wide
  // cp.async (the lanes' n-th ones) copied: per lane the shared and global addresses and bytes.
  struct AccessRec {
    int lane;
    uint32_t dst;
    uintptr_t src;
    int bytes, src_bytes;
  };
  bool counting = false;
  std::vector<uint32_t> cp_seq;
  const char* kernel_name = "";
  std::map<std::pair<int, uint32_t>, std::vector<AccessRec>> cp_recs;
  // mbarriers by shared address. Their 8 bytes of shared memory hold a copy of the state, so that
  // an ordinary store over a live barrier is caught at its next use.
  struct Mbar {
    uint32_t count = 0, pending = 0, phase = 0;
    int32_t tx = 0;
  };
  std::unordered_map<uint32_t, Mbar> mbars;
  // TMA copies issued and not landed yet: the bytes they will write, where, and their barrier.
  struct Bulk {
    uint32_t dst, bar;
    std::vector<unsigned char> image;
  };
  std::deque<Bulk> bulk;
  // Named barriers 1..15 (bar.sync id, count); 0 is __syncthreads.
  struct Named {
    int arrived = 0, count = 0;
    unsigned gen = 0;
  };
  Named named[16];
  // wgmma per thread: the operations issued since the last commit, the committed groups not yet
  // retired, whether a wgmma.fence came since the thread last touched its accumulators, and how
  // many it issued; per warp group, each operation's operands (the same for all 128 threads).
  struct WgOp {
    float* d;
    int n;
    uint64_t da, db;  // as issued (every thread of the warp group issues the same)
    Desc a, b;        // decoded once, at the issue
    MmaKind kind;
  };
  struct Wgmma {
    std::vector<WgOp> open;
    std::deque<std::vector<WgOp>> groups;
    bool fenced = false;
    size_t issued = 0;
  };
  std::vector<Wgmma> wgmma;
  std::vector<std::vector<WgOp>> wg_ops;

  Block() {
    void* p = mmap(nullptr, kStack * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    stacks = static_cast<char*>(p);
  }
  ~Block() { munmap(stacks, kStack * kMaxThreads); }
};

thread_local Block* g_block = nullptr;

// The blocks of the cluster being run (one entry, the block itself, without clusters), and the
// cluster barrier's state: arrivals of this generation and the generation.
struct Cluster {
  std::vector<Block*> blocks;
  int arrived = 0;
  unsigned gen = 0;
  // Threads of the cluster that have not exited.
  int live() const {
    int n = 0;
    for (const Block* b : blocks) n += b->live;
    return n;
  }
};
thread_local Cluster g_cluster;
// Blocks kept for the thread's life (their stacks are reused): the first runs grids without
// clusters, the first n a grid with clusters of n blocks.
thread_local std::vector<Block*> g_blocks;

Block& block(size_t i = 0) {
  while (g_blocks.size() <= i) g_blocks.push_back(new Block());
  return *g_blocks[i];
}

// Announces a switch to the scheduler's stack (`exiting`: this fiber's stack is done with).
inline void to_scheduler(Block& b, Fiber* f, bool exiting) {
#if PLX_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f->asan_fake, b.sched_bottom, b.sched_size);
#else
  (void)b, (void)f, (void)exiting;
#endif
}
inline void back_in_fiber(Fiber* f) {
#if PLX_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake, nullptr, nullptr);
#else
  (void)f;
#endif
}

void fiber_entry() {
  Block& b = *g_block;
  Fiber* f = b.current;
#if PLX_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.sched_bottom, &b.sched_size);
#endif
  try {
    (*b.body)();
    if (f->pdl_pending && b.fault.empty()) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "thread (%u,%u,%u) of block (%u,%u,%u) exited without "
                    "cudaGridDependencySynchronize (pdl_wait), in a kernel launched to overlap "
                    "the kernel before it (programmatic stream serialization)",
                    f->thread.idx.x, f->thread.idx.y, f->thread.idx.z, g_block_idx.x, g_block_idx.y,
                    g_block_idx.z);
      b.fault = buf;
    }
  } catch (const std::exception& e) {
    if (b.fault.empty()) b.fault = e.what();
  } catch (...) {
    if (b.fault.empty()) b.fault = "a CUDA thread threw";
  }
  f->done = true;
  b.warps[static_cast<size_t>(f->thread.linear / kWarp)].exited |= 1u << (f->thread.linear % kWarp);
  --b.live;
  b.progress = true;
  // Threads that exited are not waited for at __syncthreads: the others may go on now.
  if (b.arrived > 0 && b.arrived >= b.live) {
    b.result[b.gen & 1] = b.acc;
    b.acc = 0;
    b.arrived = 0;
    ++b.gen;
  }
  to_scheduler(b, f, true);
  plx_emu_switch(&f->sp, b.sched_sp);
  __builtin_unreachable();
}

// Back to the scheduler until this fiber's barrier is released.
void park(Block& b, const char* where) {
  Fiber* f = b.current;
  f->waiting = true;
  f->where = where;
  to_scheduler(b, f, false);
  plx_emu_switch(&f->sp, b.sched_sp);
  back_in_fiber(f);
  f->waiting = false;
}

std::string describe(const Block& b, const char* name) {
  std::string waits;
  int shown = 0;
  for (const Fiber& f : b.fibers) {
    if (f.done || !f.waiting || shown >= 4) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%sthread (%u,%u,%u) at %s", shown ? ", " : "", f.thread.idx.x,
                  f.thread.idx.y, f.thread.idx.z, f.where);
    waits += buf;
    ++shown;
  }
  char head[256];
  std::snprintf(head, sizeof head, "%s, block (%u,%u,%u): ", name, g_block_idx.x, g_block_idx.y,
                g_block_idx.z);
  return head + waits;
}

// The order the fibers of a block run in between barriers (PLEXUS_EMU_SCHEDULE): "forward"
// (thread 0 first, the default), "reverse", "shuffle" (a fixed pseudo-random permutation per
// pass), or "ahead" (each warp, the last first, runs as far as it can before the next: warps
// drift apart between __syncthreads as far as CUDA allows). A kernel whose result depends on it reads shared or global memory another thread
// writes without a barrier between: a race that the GPU's warp scheduler may or may not show.
enum class Schedule { kForward, kReverse, kShuffle, kAhead };
// The schedule environment variable `var` names ("forward" when unset); `ahead` whether "ahead"
// is one it takes. Anything else is reported and runs forward.
Schedule schedule_from_env(const char* var, bool ahead) {
  const char* e = std::getenv(var);
  const std::string v = e ? e : "";
  if (v == "reverse") return Schedule::kReverse;
  if (v == "shuffle") return Schedule::kShuffle;
  if (ahead && v == "ahead") return Schedule::kAhead;
  if (!v.empty() && v != "forward")
    std::fprintf(stderr, "cuda emulator: %s=%s: expected %s; running forward\n", var, v.c_str(),
                 ahead ? "forward, reverse, shuffle or ahead" : "forward, reverse or shuffle");
  return Schedule::kForward;
}
Schedule schedule() {
  static const Schedule s = schedule_from_env("PLEXUS_EMU_SCHEDULE", true);
  return s;
}
thread_local uint32_t g_pass = 0;
int schedule_index(int i, int n) {
  switch (schedule()) {
    case Schedule::kReverse: return n - 1 - i;
    case Schedule::kShuffle: {
      if (i == 0) ++g_pass;
      // i -> (a i + c) mod n with a odd and coprime to n's odd part: a permutation of 0..n-1
      // for every n when a is chosen coprime to n.
      uint32_t a = 2654435761u % static_cast<uint32_t>(n);
      while (std::gcd(a, static_cast<uint32_t>(n)) != 1) ++a;
      return static_cast<int>((static_cast<uint64_t>(a) * i + g_pass * 40503u) % n);
    }
    default: return i;
  }
}

// ---- PLEXUS_EMU_ACCESS: shared-memory wavefronts and global sectors of the Tensor Core paths ----
//
// For each kernel (and its dynamic shared memory, which tells tiles apart), over every block it
// ran: its ldmatrix matrices and the shared-memory wavefronts they take (a matrix's eight
// 16-byte rows are one request: one wavefront where they fall on distinct banks); its warp-wide
// cp.async instructions (the lanes' n-th copies), the wavefronts of their shared-memory writes
// (a request per 128 bytes of lanes: 8 lanes of 16-byte copies, 16 of 8, 32 of 4) and the
// 32-byte global sectors they read, against the fewest the same bytes could take.
std::mutex g_access_mu;
std::map<std::string, AccessCounts> g_access;
int g_access_on = -1;  // -1: PLEXUS_EMU_ACCESS not read yet

void write_access() {
  const char* path = std::getenv("PLEXUS_EMU_ACCESS");
  FILE* f = path ? std::fopen(path, "a") : nullptr;
  if (!f) return;
  std::lock_guard<std::mutex> lock(g_access_mu);
  for (const auto& [k, a] : g_access)
    std::fprintf(f,
                 "%s\tldmatrix %llu wavefronts %llu ideal %llu\tcp.async %llu wavefronts %llu "
                 "ideal %llu sectors %llu ideal %llu\n",
                 k.c_str(), a.ldmatrix, a.ldmatrix_wavefronts, a.ldmatrix_ideal, a.cp_async,
                 a.cp_async_wavefronts, a.cp_async_ideal, a.sectors, a.sectors_ideal);
  std::fclose(f);
}

bool access_on() {
  std::lock_guard<std::mutex> lock(g_access_mu);
  if (g_access_on < 0) {
    const char* e = std::getenv("PLEXUS_EMU_ACCESS");
    g_access_on = e && *e;
    if (g_access_on) std::atexit(write_access);
  }
  return g_access_on > 0;
}

void add_counts(const std::string& key, const AccessCounts& c) {
  std::lock_guard<std::mutex> lock(g_access_mu);
  AccessCounts& a = g_access[key];
  a.ldmatrix += c.ldmatrix;
  a.ldmatrix_wavefronts += c.ldmatrix_wavefronts;
  a.ldmatrix_ideal += c.ldmatrix_ideal;
  a.cp_async += c.cp_async;
  a.cp_async_wavefronts += c.cp_async_wavefronts;
  a.cp_async_ideal += c.cp_async_ideal;
  a.sectors += c.sectors;
  a.sectors_ideal += c.sectors_ideal;
}

std::string access_key(const Block& b, const char* what) {
  return std::string(b.kernel_name) + " smem " + std::to_string(b.smem.size()) + " " + what;
}

// The wavefronts one shared-memory request takes: accesses (address, bytes) to 32 banks of 4
// bytes; lanes reading the same word share it, different words on one bank are served one after
// another.
int shared_wavefronts(const std::vector<std::pair<uint32_t, int>>& acc) {
  std::map<int, std::vector<uint32_t>> words;  // bank -> distinct words
  for (const auto& [addr, bytes] : acc)
    for (int j = 0; j < bytes / 4; ++j) {
      const uint32_t w = addr / 4 + static_cast<uint32_t>(j);
      auto& v = words[static_cast<int>(w % 32)];
      if (std::find(v.begin(), v.end(), w) == v.end()) v.push_back(w);
    }
  size_t most = 0;
  for (const auto& [bank, v] : words) most = std::max(most, v.size());
  return static_cast<int>(most);
}

// A block's warp-wide cp.async instructions, added to its kernel's counts.
void count_block_copies(Block& b) {
  std::map<int, AccessCounts> by_size;
  for (const auto& [key, recs] : b.cp_recs) {
    const int bytes = recs.front().bytes;
    AccessCounts& add = by_size[bytes];
    ++add.cp_async;
    const int per = 128 / bytes;  // lanes a request
    std::map<int, std::vector<std::pair<uint32_t, int>>> phases;
    std::map<uintptr_t, int> src;  // distinct global addresses and their bytes
    for (const Block::AccessRec& r : recs) {
      phases[r.lane / per].push_back({r.dst, r.bytes});
      if (r.src_bytes > 0) src[r.src] = std::max(src[r.src], r.src_bytes);
    }
    for (const auto& [ph, acc] : phases) {
      add.cp_async_wavefronts += static_cast<unsigned long long>(shared_wavefronts(acc));
      ++add.cp_async_ideal;
    }
    std::vector<uintptr_t> sectors;
    unsigned long long total = 0;
    for (const auto& [at, n] : src) {
      total += static_cast<unsigned long long>(n);
      for (uintptr_t x = at / 32; x <= (at + static_cast<uintptr_t>(n) - 1) / 32; ++x)
        sectors.push_back(x);
    }
    std::sort(sectors.begin(), sectors.end());
    add.sectors += static_cast<unsigned long long>(std::unique(sectors.begin(), sectors.end()) -
                                                   sectors.begin());
    add.sectors_ideal += (total + 31) / 32;
  }
  b.cp_recs.clear();
  for (const auto& [bytes, add] : by_size)
    add_counts(access_key(b, ("cp" + std::to_string(bytes)).c_str()), add);
}

// Makes block b current on this host thread: its fibers, its index, its shared memory.
void enter_block(Block& b) {
  g_block = &b;
  g_block_idx = b.idx;
}

// Readies block b's nthreads fibers to run from the start.
void start_block(Block& b, const char* name, int nthreads) {
  b.kernel_name = name;
  b.counting = access_on();
  if (b.counting) {
    b.cp_seq.assign(static_cast<size_t>(nthreads), 0);
    b.cp_recs.clear();
  }
  b.live = nthreads;
  b.exited = false;
  b.arrived = 0;
  b.acc = 0;
  for (auto& w : b.warps)
    w.arrived = 0, w.mask = 0, w.exited = 0, w.mma_done[0] = w.mma_done[1] = false;
  b.async.resize(static_cast<size_t>(nthreads));
  for (auto& a : b.async) a.open.clear(), a.groups.clear();
  b.mbars.clear();
  b.bulk.clear();
  for (auto& n : b.named) n = Block::Named{};
  // (Kept between blocks and cleared where used: most kernels issue no wgmma.)
  if (b.wgmma.size() < static_cast<size_t>(nthreads)) b.wgmma.resize(static_cast<size_t>(nthreads));
  for (auto& w : b.wgmma)
    if (w.issued || w.fenced || !w.open.empty() || !w.groups.empty()) w = Block::Wgmma{};
  b.wg_ops.resize(static_cast<size_t>((nthreads + 127) / 128));
  for (auto& ops : b.wg_ops) ops.clear();
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.waiting = false;
    f.cluster_arrived = false;
    f.thread.linear = t;
    f.pdl_pending = b.programmatic;
    f.thread.idx = {t % ::blockDim.x, (t / ::blockDim.x) % ::blockDim.y,
                    t / (::blockDim.x * ::blockDim.y)};
    // A fresh stack: fiber_entry's address for plx_emu_switch's `ret`, six zero registers below.
#if PLX_EMU_ASAN
    // Frames a fiber left when its launch failed may still be poisoned.
    __asan_unpoison_memory_region(b.stacks + kStack * t, kStack);
#endif
    auto top = reinterpret_cast<uintptr_t>(b.stacks + kStack * (t + 1)) & ~uintptr_t{15};
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;  // fiber_entry's (never used) return address: keeps its frame 16-aligned
    *--sp = reinterpret_cast<void*>(&fiber_entry);
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    f.sp = sp;
  }
}

// One round of the current block's fibers (each runs until it finishes or waits); whether any
// made progress.
bool run_pass(Block& b, const char* name, int nthreads) {
  const int nwarps = (nthreads + kWarp - 1) / kWarp;
  const bool ahead = schedule() == Schedule::kAhead;
  bool moved = false;
  for (int wi = 0; wi < nwarps; ++wi) {
    // "ahead": the last warp first, each warp as far as it can go (to a __syncthreads) before
    // the next one runs; otherwise one pass over the block's threads in schedule order.
    const int w = ahead ? nwarps - 1 - wi : 0;
    const int lo = ahead ? w * kWarp : 0;
    const int hi = ahead ? std::min(nthreads, lo + kWarp) : nthreads;
    do {
      b.progress = false;
      for (int i = lo; i < hi; ++i) {
        Fiber& f = b.fibers[ahead ? i : schedule_index(i, nthreads)];
        if (f.done) continue;
        b.current = &f;
        g_thread = &f.thread;
#if PLX_EMU_ASAN
        void* fake = nullptr;
        __sanitizer_start_switch_fiber(&fake, b.stacks + kStack * (&f - b.fibers.data()), kStack);
#endif
        plx_emu_switch(&b.sched_sp, f.sp);
#if PLX_EMU_ASAN
        __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
        if (!b.fault.empty()) throw LaunchFault(std::string(name) + ": " + b.fault);
      }
      moved = moved || b.progress;
    } while (ahead && b.progress);
    if (!ahead) break;
  }
  b.progress = moved;
  return moved;
}

// After the current block's last thread exited: its access counts, and no TMA copy left in
// flight.
void finish_block(Block& b, const char* name) {
  g_thread = nullptr;
  b.exited = true;
  if (b.counting) count_block_copies(b);
  if (!b.bulk.empty()) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  ", block (%u,%u,%u): %zu TMA copies still in flight when the block exited (no "
                  "thread waited on the mbarrier at shared address %u)",
                  g_block_idx.x, g_block_idx.y, g_block_idx.z, b.bulk.size(), b.bulk.front().bar);
    throw LaunchFault(name + std::string(buf));
  }
}

Schedule block_schedule();  // PLEXUS_EMU_BLOCKS (below)

// Runs the blocks of g_cluster (one block without clusters) together until every thread of
// each has exited: a round of each block's fibers in rank order, again while any moves.
void run_cluster(const char* name, int nthreads) {
  for (Block* b : g_cluster.blocks) {
    enter_block(*b);
    start_block(*b, name, nthreads);
  }
  g_cluster.arrived = 0;
  const size_t n = g_cluster.blocks.size();
  const Schedule order = block_schedule();
  for (uint64_t round = 0;; ++round) {
    bool moved = false, live = false;
    for (size_t i = 0; i < n; ++i) {
      // The blocks' order in a round follows PLEXUS_EMU_BLOCKS: by rank, the last first, or
      // starting one rank further each round.
      const size_t r = order == Schedule::kReverse   ? n - 1 - i
                       : order == Schedule::kShuffle ? (i + round) % n
                                                     : i;
      Block* b = g_cluster.blocks[r];
      if (b->exited) continue;
      enter_block(*b);
      moved = run_pass(*b, name, nthreads) || moved;
      if (b->live == 0)
        finish_block(*b, name);
      else
        live = true;
    }
    if (!live) break;
    if (!moved) {
      std::string where;
      for (Block* b : g_cluster.blocks) {
        if (b->exited) continue;
        enter_block(*b);
        where += (where.empty() ? "" : "; ") + describe(*b, name);
      }
      throw LaunchFault("deadlock in " + where +
                        (g_cluster.blocks.size() > 1
                             ? ": a barrier that some threads of the cluster never reach"
                             : ": a barrier that some threads of the block never reach"));
    }
  }
  g_thread = nullptr;
}

}  // namespace

// ---- barriers ----

void sync_block() { (void)sync_block_count(0); }

int sync_block_or(int v) { return sync_block_count(v != 0) != 0; }

int sync_block_count(int v) {
  Block& b = *g_block;
  const unsigned my_gen = b.gen;
  b.acc += v != 0;
  ++b.arrived;
  b.progress = true;
  if (b.arrived >= b.live) {  // the last to arrive (threads that exited are not waited for)
    b.result[my_gen & 1] = b.acc;
    b.acc = 0;
    b.arrived = 0;
    ++b.gen;
    b.progress = true;
  } else {
    do {
      park(b, "__syncthreads");
    } while (b.gen == my_gen);
    b.progress = true;
  }
  return b.result[my_gen & 1];
}

namespace {

// The lanes of `mask` meet; returns the bank of slots written before the meeting, and sets
// *gen_out (if given) to the meeting's generation.
int warp_meet(Block& b, unsigned mask, const void* mine, size_t bytes, const char* what,
              unsigned* gen_out = nullptr) {
  const int lane = lane_id(), w = g_thread->linear / kWarp;
  Block::Warp& warp = b.warps[w];
  const int lanes_here = std::min(kWarp, block_threads() - w * kWarp);
  const unsigned exists = lanes_here == kWarp ? ~0u : (1u << lanes_here) - 1u;
  if (!(mask & (1u << lane))) trap((std::string(what) + " called by a lane outside its mask").c_str());
  if (mask & ~exists) trap((std::string(what) + ": the mask names lanes the block does not have").c_str());
  if (mask & warp.exited)
    trap((std::string(what) + ": the mask names a lane that has exited").c_str());
  if (warp.arrived == 0) warp.mask = mask;
  else if (warp.mask != mask) trap((std::string(what) + ": lanes of one warp disagree on the mask").c_str());
  const unsigned my_gen = warp.gen;
  if (bytes) std::memcpy(warp.slot[my_gen & 1][lane], mine, bytes);
  warp.arrived |= 1u << lane;
  b.progress = true;
  if ((warp.arrived & mask) == mask) {
    warp.arrived = 0;
    ++warp.gen;
    b.progress = true;
  } else {
    for (;;) {
      park(b, what);
      if (warp.gen != my_gen) break;
      if (mask & warp.exited)
        trap((std::string(what) + ": the mask names a lane that has exited").c_str());
    }
    b.progress = true;
  }
  if (gen_out) *gen_out = my_gen;
  return static_cast<int>(my_gen & 1);
}

}  // namespace

void sync_warp(unsigned mask) { (void)warp_meet(*g_block, mask, nullptr, 0, "__syncwarp"); }

void shfl(unsigned mask, const void* mine, void* out, size_t bytes, int src) {
  Block& b = *g_block;
  if (bytes > 16) trap("a warp shuffle of more than 16 bytes");
  const int bank = warp_meet(b, mask, mine, bytes, "__shfl_*_sync");
  if (src < 0 || src >= kWarp || !(mask & (1u << src)))
    trap("__shfl_*_sync reads a lane outside the mask");
  std::memcpy(out, b.warps[g_thread->linear / kWarp].slot[bank][src], bytes);
}

void* dynamic_smem() { return g_block->smem.data(); }

// ---- PTX (plx_emu_ptx.hpp) ----

namespace {

// The lanes a warp-wide (.sync.aligned) instruction needs: all 32, every one of them live.
unsigned whole_warp(const char* what) {
  const int w = g_thread->linear / kWarp;
  if (block_threads() - w * kWarp < kWarp)
    trap((std::string(what) + ": the warp has fewer than 32 threads (the block size is not a "
                              "multiple of 32), but the instruction needs all of them").c_str());
  return ~0u;
}

// A shared::cluster address (mapa's result) of block rank r's shared address a: a + (r + 1)
// << kClusterShift. A block's own shared addresses stay below 1 << kClusterShift.
constexpr int kClusterShift = 24;

// The bytes at shared address `addr` (an offset into block b's dynamic shared memory).
unsigned char* shared_at_in(Block& b, uint32_t addr, size_t bytes, size_t align,
                            const char* what) {
  if (addr >> kClusterShift) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s: shared address %#x is a shared::cluster address (mapa's), where the "
                  "instruction takes the block's own (shared::cta)",
                  what, addr);
    trap(buf);
  }
  if (addr < kSharedBase) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: shared address %u is below the dynamic shared memory (%u)",
                  what, addr, kSharedBase);
    trap(buf);
  }
  if (addr % align != 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: shared address %u is not %zu-byte aligned", what, addr, align);
    trap(buf);
  }
  if (static_cast<size_t>(addr - kSharedBase) + bytes > b.smem.size()) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s: shared address %u + %zu bytes is past the launch's %zu bytes of dynamic "
                  "shared memory (from %u)", what, addr, bytes, b.smem.size(), kSharedBase);
    trap(buf);
  }
  return b.smem.data() + (addr - kSharedBase);
}
unsigned char* shared_at(uint32_t addr, size_t bytes, size_t align, const char* what) {
  return shared_at_in(*g_block, addr, bytes, align, what);
}

// When a cp.async's bytes land in shared memory (PLEXUS_EMU_CP_ASYNC): "late" (the default) at
// the cp.async.wait_group that retires its group, so that a read of the stage before the wait
// sees the old bytes; "early" when it is issued, so that a copy into a stage other warps still
// read changes what they read.
bool cp_async_early() {
  static const bool early = [] {
    const char* e = std::getenv("PLEXUS_EMU_CP_ASYNC");
    const std::string v = e ? e : "";
    if (!v.empty() && v != "late" && v != "early")
      std::fprintf(stderr, "cuda emulator: PLEXUS_EMU_CP_ASYNC=%s: expected late or early; "
                           "running late\n", v.c_str());
    return v == "early";
  }();
  return early;
}

void land(const std::vector<Block::AsyncCopy>& copies) {
  for (const Block::AsyncCopy& c : copies) std::memcpy(c.dst, c.data, static_cast<size_t>(c.bytes));
}

}  // namespace

void count_accesses(bool on) {
  (void)access_on();  // PLEXUS_EMU_ACCESS read first, so that its file is still written
  std::lock_guard<std::mutex> lock(g_access_mu);
  g_access_on = on;
}

bool access_counts(const char* key, AccessCounts* out) {
  std::lock_guard<std::mutex> lock(g_access_mu);
  const auto it = g_access.find(key);
  if (it == g_access.end()) return false;
  *out = it->second;
  return true;
}

uint32_t shared_address(const void* p) {
  Block& b = *g_block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (b.smem.empty() || c < b.smem.data() || c > b.smem.data() + b.smem.size())
    trap("__cvta_generic_to_shared: the emulator maps only the launch's dynamic shared memory "
         "(extern __shared__) to shared addresses");
  return static_cast<uint32_t>(c - b.smem.data()) + kSharedBase;
}

void cp_async(uint32_t dst, const void* src, int bytes, int src_bytes) {
  check_device_access("cp.async", src);
  if (bytes != 4 && bytes != 8 && bytes != 16) trap("cp.async: the copy size must be 4, 8 or 16");
  if (src_bytes < 0 || src_bytes > bytes) trap("cp.async: src-size past the copy size");
  if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0)
    trap("cp.async: the global source is not aligned to the copy size");
  Block::AsyncCopy c{shared_at(dst, static_cast<size_t>(bytes), static_cast<size_t>(bytes), "cp.async"),
                     {}, bytes};  // data zeroed: the zero fill past src_bytes
  if (src_bytes > 0) std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  if (g_block->counting) {
    Block& b = *g_block;
    const int t = g_thread->linear;
    const uint32_t n = b.cp_seq[static_cast<size_t>(t)]++;
    b.cp_recs[{t / kWarp, n}].push_back(
        {t % kWarp, dst, reinterpret_cast<uintptr_t>(src), bytes, src_bytes});
  }
  if (cp_async_early()) land({c});
  else
    g_block->async[static_cast<size_t>(g_thread->linear)].open.push_back(c);
}

void cp_async_commit() {
  Block::Async& a = g_block->async[static_cast<size_t>(g_thread->linear)];
  a.groups.push_back(std::move(a.open));  // an empty group counts, as in PTX
  a.open.clear();
}

void cp_async_wait(int pending) {
  Block::Async& a = g_block->async[static_cast<size_t>(g_thread->linear)];
  while (static_cast<int>(a.groups.size()) > pending) {
    land(a.groups.front());
    a.groups.pop_front();
  }
}

void ldmatrix(uint32_t* r, int count, uint32_t addr, bool trans) {
  Block& b = *g_block;
  const unsigned mask = whole_warp("ldmatrix");
  const int bank = warp_meet(b, mask, &addr, sizeof addr, "ldmatrix");
  const auto& slot = b.warps[g_thread->linear / kWarp].slot[bank];
  auto row_addr = [&](int lane) {
    uint32_t a;
    std::memcpy(&a, slot[lane], sizeof a);
    return a;
  };
  // Matrix i's rows are addressed by lanes 8i .. 8i+7; this lane gets row lane / 4, elements
  // 2 (lane % 4) and + 1 of it, or with .trans, element lane / 4 of rows 2 (lane % 4) and + 1.
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  if (lane == 0 && b.counting) {
    AccessCounts add;
    for (int i = 0; i < count; ++i) {
      std::vector<std::pair<uint32_t, int>> rows;
      for (int r = 0; r < 8; ++r) rows.push_back({row_addr(8 * i + r), 16});
      ++add.ldmatrix;
      add.ldmatrix_wavefronts += static_cast<unsigned long long>(shared_wavefronts(rows));
      ++add.ldmatrix_ideal;
    }
    add_counts(access_key(b, "ldmatrix"), add);
  }
  for (int i = 0; i < count; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const unsigned char* row = shared_at(row_addr(8 * i + g), 16, 16, "ldmatrix");
      std::memcpy(&lo, row + 4 * t, 2);
      std::memcpy(&hi, row + 4 * t + 2, 2);
    } else {
      std::memcpy(&lo, shared_at(row_addr(8 * i + 2 * t), 16, 16, "ldmatrix") + 2 * g, 2);
      std::memcpy(&hi, shared_at(row_addr(8 * i + 2 * t + 1), 16, 16, "ldmatrix") + 2 * g, 2);
    }
    r[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
}

// mma.sync: the lanes meet with their fragments and the addresses of their accumulators; the
// first lane to run after the meeting (the last to arrive) computes D for the whole warp, each
// operand decoded once, and writes every lane's c (the lanes are all parked in the meeting, so
// their accumulators hold what they held at the instruction); the others find it done.
void mma(float* c, const uint32_t* a, const uint32_t* bf, MmaKind kind) {
  Block& b = *g_block;
  const unsigned mask = whole_warp("mma.sync");
  struct Offer {
    uint32_t r[6];  // a0..a3, b0, b1
    float* c;
  };
  static_assert(sizeof(Offer) <= kSlot, "an mma's offer fits a lane's slot");
  const Offer mine{{a[0], a[1], a[2], a[3], bf[0], bf[1]}, c};
  unsigned gen = 0;
  const int bank = warp_meet(b, mask, &mine, sizeof mine, "mma.sync", &gen);
  Block::Warp& warp = b.warps[g_thread->linear / kWarp];
  if (warp.mma_done[bank] && warp.mma_gen[bank] == gen) return;
  warp.mma_done[bank] = true;
  warp.mma_gen[bank] = gen;
  Offer lanes[kWarp];
  for (int l = 0; l < kWarp; ++l) std::memcpy(&lanes[l], warp.slot[bank][l], sizeof(Offer));
  auto half_value = [&](uint32_t v, int half) -> double {
    const auto bits = static_cast<uint16_t>(half ? v >> 16 : v & 0xffffu);
    if (kind == MmaKind::kBF16) return plexus::bf16_bits_to_f32(bits);
    return plexus::f16_bits_to_f32(bits);
  };
  auto tf32_value = [](uint32_t v) -> double {
    v &= ~0x1fffu;  // the MMA reads 19 bits of each f32 (sign, exponent, 10 of the mantissa)
    float f;
    std::memcpy(&f, &v, sizeof f);
    return f;
  };
  // Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 / m16n8k8"): lane (g, t) = (lane / 4,
  // lane % 4) holds D rows g and g + 8, columns 2t and 2t + 1, as c0, c1 (row g), c2, c3.
  const int K = kind == MmaKind::kTF32 ? 8 : 16;
  double A[16][16], B[16][8];
  for (int row = 0; row < 16; ++row)
    for (int k = 0; k < K; ++k) {
      if (kind == MmaKind::kTF32) {
        // a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4].
        A[row][k] = tf32_value(lanes[(row % 8) * 4 + k % 4].r[(row / 8) + 2 * (k / 4)]);
      } else {
        // Register j of lane (g', t'): A[g' + 8 (j % 2)][2t' + 8 (j / 2) + {0, 1}].
        A[row][k] =
            half_value(lanes[(row % 8) * 4 + (k % 8) / 2].r[(row / 8) + 2 * (k / 8)], k % 2);
      }
    }
  for (int col = 0; col < 8; ++col)
    for (int k = 0; k < K; ++k) {
      if (kind == MmaKind::kTF32) {
        // b0 = B[t'][g'], b1 = B[t' + 4][g'] (registers 4 and 5 of the meeting).
        B[k][col] = tf32_value(lanes[col * 4 + k % 4].r[4 + k / 4]);
      } else {
        // Register j of lane (g', t'): B[2t' + 8j + {0, 1}][g'].
        B[k][col] = half_value(lanes[col * 4 + (k % 8) / 2].r[4 + k / 8], k % 2);
      }
    }
  // The products are exact in double (at most 11 + 11 significant bits: so also inside an FMA);
  // each sum starts from c, adds the products in k order and is rounded once, to f32. k is the
  // outer loop, so the 128 sums are independent chains (vectorised along a row of D).
  double D[16][8];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e) D[g + 8 * h][2 * t + e] = lanes[l].c[2 * h + e];
  }
  for (int k = 0; k < K; ++k)
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) D[row][col] += A[row][k] * B[k][col];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e)
        lanes[l].c[2 * h + e] = static_cast<float>(D[g + 8 * h][2 * t + e]);
  }
}

// ---- Hopper PTX (plx_emu_wgmma.hpp) ----

namespace {

// mbarrier ranges (PTX ISA, "Contents of the mbarrier object"): the counts, and the tx-count's
// magnitude, at most 2^20 - 1.
constexpr int64_t kMbarMax = (int64_t{1} << 20) - 1;

// The 8 bytes a barrier's state is mirrored in (the real encoding is opaque).
uint64_t mbar_word(const Block::Mbar& m) {
  return uint64_t{m.count} | uint64_t{m.pending} << 20 |
         (static_cast<uint64_t>(static_cast<uint32_t>(m.tx)) & 0x1FFFFF) << 40 |
         uint64_t{m.phase & 1} << 61 | uint64_t{1} << 63;
}

void mbar_store(Block& b, uint32_t bar, const Block::Mbar& m) {
  const uint64_t w = mbar_word(m);
  std::memcpy(shared_at_in(b, bar, 8, 8, "mbarrier"), &w, sizeof w);
}

Block::Mbar& mbar(Block& b, uint32_t bar, const char* what) {
  const unsigned char* p = shared_at_in(b, bar, 8, 8, what);
  const auto it = b.mbars.find(bar);
  char buf[200];
  if (it == b.mbars.end()) {
    std::snprintf(buf, sizeof buf, "%s: no mbarrier at shared address %u (mbarrier.init first)",
                  what, bar);
    trap(buf);
  }
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  if (w != mbar_word(it->second)) {
    std::snprintf(buf, sizeof buf,
                  "%s: the mbarrier at shared address %u was overwritten by an ordinary store",
                  what, bar);
    trap(buf);
  }
  return it->second;
}

// A phase completes when no arrival and no transaction byte is pending: the barrier moves to the
// next phase and expects its count of arrivals again.
void mbar_settle(Block& b, uint32_t bar, Block::Mbar& m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.count;
    b.progress = true;
  }
  mbar_store(b, bar, m);
}

// Adds `delta` to the tx-count of barrier m (at `bar`), range-checked; the caller settles it.
void add_tx(Block::Mbar& m, uint32_t bar, int64_t delta, const char* what) {
  const int64_t tx = int64_t{m.tx} + delta;
  if (tx > kMbarMax || tx < -kMbarMax) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s: the tx-count of the mbarrier at shared address %u leaves "
                  "its range (+-(2^20 - 1)): %lld",
                  what, bar, static_cast<long long>(tx));
    trap(buf);
  }
  m.tx = static_cast<int32_t>(tx);
}

void land_bulk(Block& b, const Block::Bulk& c) {
  std::memcpy(shared_at_in(b, c.dst, c.image.size(), 1, "cp.async.bulk.tensor"), c.image.data(),
              c.image.size());
  b.progress = true;
  const char* what = "cp.async.bulk.tensor (complete_tx)";
  Block::Mbar& m = mbar(b, c.bar, what);
  add_tx(m, c.bar, -static_cast<int64_t>(c.image.size()), what);
  mbar_settle(b, c.bar, m);
}

// Lands the TMA copies still in flight that complete on `bar`, oldest first; false if none.
bool land_bulk_on(Block& b, uint32_t bar) {
  bool any = false;
  for (auto it = b.bulk.begin(); it != b.bulk.end();) {
    if (it->bar != bar) {
      ++it;
      continue;
    }
    const Block::Bulk c = std::move(*it);
    it = b.bulk.erase(it);
    land_bulk(b, c);
    any = true;
  }
  return any;
}

// The first thread of the calling thread's warp group (4 warps, 128 threads), which must be whole.
int warpgroup_base(const char* what) {
  const int base = g_thread->linear / 128 * 128;
  if (base + 128 > block_threads())
    trap((std::string(what) + ": the warp group has fewer than 128 threads (the block size is "
                              "not a multiple of 128), but the instruction needs all of them")
             .c_str());
  return base;
}

// One 16-bit element of a wgmma operand in shared memory: row `mn` (of M or N) and column `k` of
// the matrix descriptor `desc` (PTX ISA, "Matrix Descriptor Format" and the canonical layouts of
// "Shared Memory Matrix Layout"), K-major or MN-major, with the 128-, 64- or 32-byte swizzle
// (layout types 1, 2, 3), whose rows are R = 128, 64 or 32 bytes:
//   K-major:  rows of R bytes (R / 2 of K) in atoms of 8 rows, SBO bytes from one 8-row group of
//             M/N to the next; LBO unused.
//   MN-major: R / 2 of M/N per R-byte row, rows along K in atoms of 8, LBO bytes from one
//             (R / 2)-wide group of M/N to the next, SBO bytes from one 8-row group of K to the
//             next.
// The swizzle exchanges the 16-byte chunks of each row by the row's place in its 8·R-byte
// pattern: address bits 4.. ^= bits 7.. (3, 2 or 1 bits: CUTLASS's Swizzle<3|2|1, 4, 3>).

// Where the swizzle of rows `span` bytes wide puts shared byte `logical`.
uint32_t swizzle_at(uint32_t logical, uint32_t span) {
  return logical ^ (((logical >> 7) & (span / 16 - 1)) << 4);
}

Desc decode_desc(uint64_t desc, bool mn_major, const char* which) {
  char buf[240];
  // Bits 14-15, 30-31, 46-48 and 52-61 are not fields.
  constexpr uint64_t kReserved =
      (uint64_t{3} << 14) | (uint64_t{3} << 30) | (uint64_t{7} << 46) | (uint64_t{0x3FF} << 52);
  if (desc & kReserved) {
    std::snprintf(buf, sizeof buf,
                  "wgmma.mma_async: the %s descriptor 0x%016llx sets bits that are "
                  "no field",
                  which, static_cast<unsigned long long>(desc));
    trap(buf);
  }
  const unsigned layout = static_cast<unsigned>(desc >> 62);
  if (layout == 0) {
    std::snprintf(buf, sizeof buf,
                  "wgmma.mma_async: the %s descriptor's layout type 0 (no swizzle) is not "
                  "modelled (only 1, 2 and 3: the 128-, 64- and 32-byte swizzles)",
                  which);
    trap(buf);
  }
  const uint32_t span = 256u >> layout;  // 1: 128, 2: 64, 3: 32 bytes
  Desc d{static_cast<uint32_t>(desc & 0x3FFF) << 4,
         static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4,
         static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4, mn_major, span};
  // The base offset is the pattern's phase at the start address ((start >> 7) & 7); it is 0 when
  // the layout starts on a 1024-byte boundary.
  const unsigned base = static_cast<unsigned>((desc >> 49) & 7);
  if (base != ((d.start >> 7) & 7)) {
    std::snprintf(buf, sizeof buf,
                  "wgmma.mma_async: the %s descriptor's base offset %u disagrees "
                  "with its start address %u (the swizzle pattern's row there is %u)",
                  which, base, d.start, (d.start >> 7) & 7);
    trap(buf);
  }
  if (!mn_major && d.start % span + 32 > span) {
    std::snprintf(buf, sizeof buf,
                  "wgmma.mma_async: the K-major %s operand starts at shared address "
                  "%u, so its 16 K (32 bytes) cross a %u-byte swizzle row",
                  which, d.start, span);
    trap(buf);
  }
  if (mn_major && d.start % span != 0) {
    std::snprintf(buf, sizeof buf,
                  "wgmma.mma_async: the MN-major %s operand starts at shared "
                  "address %u, inside a %u-byte swizzle row",
                  which, d.start, span);
    trap(buf);
  }
  if (d.sbo == 0 || (mn_major && d.lbo == 0)) {
    std::snprintf(buf, sizeof buf, "wgmma.mma_async: the %s descriptor's %s byte offset is 0",
                  which, d.sbo == 0 ? "stride" : "leading");
    trap(buf);
  }
  return d;
}

// `smem`: the block's dynamic shared memory, fetched once per wgmma (not per element from the
// thread-local block); an element outside it traps through shared_at, with its message.
uint16_t desc_element(const Desc& d, int mn, int k, const std::vector<unsigned char>& smem) {
  const uint32_t w = d.span / 2;  // elements per row
  const uint32_t logical =
      d.mn_major
          ? d.start + static_cast<uint32_t>(mn) % w * 2 + static_cast<uint32_t>(mn) / w * d.lbo +
                static_cast<uint32_t>(k % 8) * d.span + static_cast<uint32_t>(k / 8) * d.sbo
          : d.start + static_cast<uint32_t>(mn % 8) * d.span +
                static_cast<uint32_t>(mn / 8) * d.sbo + static_cast<uint32_t>(k) * 2;
  const uint32_t physical = swizzle_at(logical, d.span);
  const unsigned char* p =
      physical >= kSharedBase && physical % 2 == 0 && physical - kSharedBase + 2 <= smem.size()
          ? smem.data() + (physical - kSharedBase)
          : shared_at(physical, 2, 2, "wgmma.mma_async (operand)");
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// This thread's part of one wgmma.m64nNk16: D (64 x N, f32) += A (64 x 16) · B (16 x N). The
// accumulator fragment (PTX ISA, "Register Fragments: wgmma .m64nNk16", D): warp w of the warp
// group holds rows 16 w + g and 16 w + g + 8 (g = lane / 4); d[4 i + 2 h + e] is row
// 16 w + g + 8 h, column 8 i + 2 (lane % 4) + e. Products exact, the sum rounded once to f32.
// The 16 k elements of row mn of a descriptor's operand, as bits. K-major, they are 32 bytes of
// one swizzle row (decode_desc checks that), i.e. two 16-byte chunks, each moved whole by the
// swizzle: two reads; MN-major, one element per k row.
void desc_row(const Desc& d, int mn, const std::vector<unsigned char>& smem, uint16_t (&out)[16]) {
  if (d.mn_major) {
    for (int k = 0; k < 16; ++k) out[k] = desc_element(d, mn, k, smem);
    return;
  }
  const uint32_t logical =
      d.start + static_cast<uint32_t>(mn % 8) * d.span + static_cast<uint32_t>(mn / 8) * d.sbo;
  for (int j = 0; j < 2; ++j) {
    const uint32_t physical = swizzle_at(logical + 16 * j, d.span);
    const unsigned char* p =
        physical >= kSharedBase && physical % 16 == 0 && physical - kSharedBase + 16 <= smem.size()
            ? smem.data() + (physical - kSharedBase)
            : shared_at(physical, 16, 16, "wgmma.mma_async (operand)");
    std::memcpy(out + 8 * j, p, 16);
  }
}

void wgmma_evaluate(const Block::WgOp& op) {
  const Desc &a = op.a, &bd = op.b;
  const int wt = g_thread->linear % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, q = lane % 4;
  const std::vector<unsigned char>& smem = g_block->smem;
  // This thread's rows (16 w + g + 8 h) of A and columns c = 8 i + 2 q + e of B (column 2 i + e
  // of Bt and D), as bits, then as values.
  const int cols = op.n / 4;
  uint16_t abits[2][16], bbits[64][16];
  for (int h = 0; h < 2; ++h) desc_row(a, 16 * warp + g + 8 * h, smem, abits[h]);
  for (int c = 0; c < cols; ++c) desc_row(bd, 8 * (c / 2) + 2 * q + c % 2, smem, bbits[c]);
  double A[2][16], B[16][64], D[2][64];
  const bool bf = op.kind == MmaKind::kBF16;
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k)
      A[h][k] = bf ? plexus::bf16_bits_to_f32(abits[h][k]) : plexus::f16_bits_to_f32(abits[h][k]);
  for (int c = 0; c < cols; ++c)
    for (int k = 0; k < 16; ++k)
      B[k][c] = bf ? plexus::bf16_bits_to_f32(bbits[c][k]) : plexus::f16_bits_to_f32(bbits[c][k]);
  // k is the outer loop, so the sums are independent chains (each from d, the products exact in
  // double, added in k order, rounded once).
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < cols; ++c) D[h][c] = op.d[4 * (c / 2) + 2 * h + c % 2];
  for (int k = 0; k < 16; ++k)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < cols; ++c) D[h][c] += A[h][k] * B[k][c];
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < cols; ++c) op.d[4 * (c / 2) + 2 * h + c % 2] = static_cast<float>(D[h][c]);
}

}  // namespace

void mbarrier_init(uint32_t bar, uint32_t count) {
  Block& b = *g_block;
  (void)shared_at(bar, 8, 8, "mbarrier.init");
  if (count == 0 || count > kMbarMax) trap("mbarrier.init: the count must be 1 to 2^20 - 1");
  Block::Mbar& m = b.mbars[bar];
  m = Block::Mbar{count, count, 0, 0};
  mbar_store(b, bar, m);
  b.progress = true;
}

namespace {

void arrive_on(Block& b, uint32_t bar, uint32_t expect_tx_bytes, const char* what) {
  Block::Mbar& m = mbar(b, bar, what);
  add_tx(m, bar, expect_tx_bytes, what);  // the expect-tx comes before the arrival
  if (m.pending == 0)  // every arrival is in and the phase waits for its transaction bytes
    trap("mbarrier.arrive: more arrivals than the phase expects (it waits for its tx bytes)");
  --m.pending;
  mbar_settle(b, bar, m);
  b.progress = true;
}

// The block of rank r in the running cluster, which must not have exited; `what` names the
// instruction in the errors.
Block& cluster_block(unsigned r, const char* what) {
  char buf[240];
  if (r >= g_cluster.blocks.size()) {
    std::snprintf(buf, sizeof buf, "%s: CTA rank %u of a cluster of %zu", what, r,
                  g_cluster.blocks.size());
    trap(buf);
  }
  Block& b = *g_cluster.blocks[r];
  if (b.exited) {
    std::snprintf(buf, sizeof buf,
                  "%s: CTA rank %u of the cluster has exited (a block must not exit while "
                  "another block of its cluster may still access its shared memory)",
                  what, r);
    trap(buf);
  }
  return b;
}

}  // namespace

void mbarrier_arrive(uint32_t bar, uint32_t expect_tx_bytes) {
  arrive_on(*g_block, bar, expect_tx_bytes,
            expect_tx_bytes ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive");
}

unsigned cluster_ctarank() { return g_block->rank; }
unsigned cluster_nctarank() { return static_cast<unsigned>(g_cluster.blocks.size()); }

uint32_t mapa(uint32_t addr, unsigned rank) {
  const char* what = "mapa.shared::cluster";
  (void)shared_at(addr, 1, 1, what);
  (void)cluster_block(rank, what);
  return addr + ((rank + 1u) << kClusterShift);
}

void mbarrier_arrive_cluster(uint32_t addr) {
  const char* what = "mbarrier.arrive.shared::cluster";
  const unsigned r = addr >> kClusterShift;
  // An address below the cluster window is the block's own.
  Block& b = r == 0 ? *g_block : cluster_block(r - 1, what);
  arrive_on(b, addr & ((1u << kClusterShift) - 1), 0, what);
  g_block->progress = true;
}

void cluster_barrier_arrive() {
  Fiber& f = *g_block->current;
  if (f.cluster_arrived)
    trap("barrier.cluster.arrive: the thread arrived twice without barrier.cluster.wait");
  f.cluster_arrived = true;
  f.cluster_gen = g_cluster.gen;
  ++g_cluster.arrived;
  g_block->progress = true;
}

void cluster_barrier_wait() {
  Block& b = *g_block;
  Fiber& f = *b.current;
  if (!f.cluster_arrived) trap("barrier.cluster.wait without barrier.cluster.arrive");
  // Released when every thread of the cluster that has not exited has arrived.
  while (g_cluster.gen == f.cluster_gen) {
    if (g_cluster.arrived >= g_cluster.live()) {
      g_cluster.arrived = 0;
      ++g_cluster.gen;
      break;
    }
    park(b, "barrier.cluster.wait");
  }
  f.cluster_arrived = false;
  b.progress = true;
}

bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  Block& b = *g_block;
  for (;;) {
    const Block::Mbar& m = mbar(b, bar, "mbarrier.try_wait.parity");
    // True for the phase before the current one (the other parity); the current is incomplete.
    if ((m.phase & 1) != (parity & 1)) {
      b.progress = true;
      return true;
    }
    if (land_bulk_on(b, bar)) continue;  // "late" TMA: the copies it waits for land now
    park(b, "mbarrier.try_wait");
  }
}

namespace {

// The tensor map of a TMA copy `what` of rank `rank`, checked: written by the encoder of the copy's
// mode (im2col or tiled), of the copy's rank, and of what the emulator models (no interleave, the
// zero fill, no swizzle or the 128-, 64- or 32-byte one). Sets swz to the swizzle's row in bytes
// (0: none).
const TensorMap& copy_map(const void* map, int rank, bool im2col, const char* what, uint32_t& swz) {
  const TensorMap& t = tensor_map(map, what);
  check_device_access(what, reinterpret_cast<const void*>(t.address));
  char buf[240];
  if (static_cast<bool>(t.im2col) != im2col) {
    std::snprintf(buf, sizeof buf, "%s: a tensor map of %s in %s copy", what,
                  t.im2col ? "cuTensorMapEncodeIm2col" : "cuTensorMapEncodeTiled",
                  im2col ? "an im2col" : "a tiled");
    trap(buf);
  }
  if (rank != t.rank) {
    std::snprintf(buf, sizeof buf, "%s.%dd on a tensor map of rank %d", what, rank, t.rank);
    trap(buf);
  }
  const char* form = im2col ? "cp.async.bulk.tensor.im2col" : "cp.async.bulk.tensor";
  if (t.interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) {
    std::snprintf(buf, sizeof buf, "%s: interleaved layouts are not modelled", form);
    trap(buf);
  }
  if (t.oob_nan) {
    std::snprintf(buf, sizeof buf, "%s: the NaN out-of-bounds fill is not modelled", form);
    trap(buf);
  }
  switch (t.swizzle) {
    case CU_TENSOR_MAP_SWIZZLE_NONE:
      swz = 0;
      break;
    case CU_TENSOR_MAP_SWIZZLE_32B:
      swz = 32;
      break;
    case CU_TENSOR_MAP_SWIZZLE_64B:
      swz = 64;
      break;
    case CU_TENSOR_MAP_SWIZZLE_128B:
      swz = 128;
      break;
    default:
      std::snprintf(buf, sizeof buf,
                    "%s: swizzles other than none, 32B, 64B and 128B are not modelled", form);
      trap(buf);
  }
  return t;
}

// A TMA copy's landing image of `bytes` in rows of `row` bytes for block b at shared address dst,
// counted on mbarrier bar, after the checks its destination takes: a swizzled box in rows of
// exactly the swizzle's width (swz bytes: the only ones modelled), dst 128-byte aligned (CUDA
// programming guide, TMA).
Block::Bulk new_box(Block& b, uint32_t dst, uint32_t bar, size_t row, size_t bytes, uint32_t swz,
                    const char* what) {
  if (swz && row != swz) {
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "%s: a %uB-swizzled box with %zu-byte rows is not modelled (only rows of "
                  "exactly %u bytes)",
                  what, swz, row, swz);
    trap(buf);
  }
  (void)shared_at(dst, bytes, 128, what);
  (void)mbar(b, bar, what);
  return Block::Bulk{dst, bar, std::vector<unsigned char>(bytes)};
}

// Where byte `off` of a box landing at shared address dst goes: the swizzle of swz-byte rows
// (0: none) exchanges the 16-byte chunks of each row by the row's place in its 8-row pattern,
// on the address (swizzle_at).
uint32_t box_offset(uint32_t dst, uint32_t off, uint32_t swz) {
  if (!swz) return off;
  return swizzle_at(dst + off, swz) - dst;
}

// The box of a TMA load as it will land at shared address dst (swizzled on that address), after
// the checks of the copy; `what` names the instruction.
Block::Bulk tma_box(uint32_t dst, const void* map, const int32_t* coords, int rank, uint32_t bar,
                    const char* what) {
  Block& b = *g_block;
  uint32_t swz = 0;
  const TensorMap& t = copy_map(map, rank, false, what, swz);
  // Elements per dimension: the box, every elem_strides-th along dimensions 1.. (dimension 0 has
  // no traversal stride without interleave).
  int64_t n[5] = {1, 1, 1, 1, 1};
  int64_t elems = 1;
  for (int i = 0; i < rank; ++i) {
    n[i] = i == 0 ? t.box[0] : (t.box[i] + t.elem_strides[i] - 1) / t.elem_strides[i];
    elems *= n[i];
  }
  Block::Bulk c = new_box(b, dst, bar, static_cast<size_t>(n[0]) * t.elem_bytes,
                          static_cast<size_t>(elems) * t.elem_bytes, swz, what);
  int64_t j[5] = {0, 0, 0, 0, 0};
  for (int64_t e = 0; e < elems; ++e) {
    int64_t rest = e;
    bool in = true;
    uint64_t src = t.address;
    for (int i = 0; i < rank; ++i) {
      j[i] = rest % n[i];
      rest /= n[i];
      const int64_t g = int64_t{coords[i]} + j[i] * (i == 0 ? 1 : t.elem_strides[i]);
      if (g < 0 || g >= static_cast<int64_t>(t.dims[i]))
        in = false;
      else
        src += static_cast<uint64_t>(g) * t.strides[i];
    }
    // box order, dimension 0 fastest
    const uint32_t off = box_offset(dst, static_cast<uint32_t>(e) * t.elem_bytes, swz);
    if (in) std::memcpy(c.image.data() + off, reinterpret_cast<const void*>(src), t.elem_bytes);
    // else: zeros (the zero out-of-bounds fill)
  }
  return c;
}

// The box of an im2col TMA load (PTX ISA, "Tensors", "im2col mode"): pixelsPerColumn rows of
// channelsPerPixel elements from channel coords[0], landing at dst as a tiled box of those rows
// would (swizzled on the address). coords[1 .. rank-2] (W, H, D) place the first pixel's filter
// base, which must lie in the bounding box (from the lower corner past the tensor's first element
// to the upper corner past its last), coords[rank-1] its image. Row p reads the pixel at the base
// plus the im2col offsets; the base then steps by the traversal stride along W, back to the lower
// corner and one stride on along H past the box's end (then D), and on to the next image past the
// last. Elements outside the tensor (any coordinate, images past the last included) are zeros.
Block::Bulk tma_im2col_box(uint32_t dst, const void* map, const int32_t* coords, int rank,
                           const uint16_t* offsets, uint32_t bar, const char* what) {
  Block& b = *g_block;
  uint32_t swz = 0;
  const TensorMap& t = copy_map(map, rank, true, what, swz);
  char buf[300];
  if (t.elem_strides[rank - 1] != 1)
    trap("cp.async.bulk.tensor.im2col: a traversal stride along the images is not modelled");
  const int spatial = rank - 2;
  // The offsets' range by rank (16 bits for one spatial dimension, 8 for two, 5 for three).
  const int off_lim = spatial == 1 ? 65536 : spatial == 2 ? 256 : 32;
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0}, base[3] = {0, 0, 0};
  for (int i = 0; i < spatial; ++i) {
    if (offsets[i] >= off_lim) {
      std::snprintf(buf, sizeof buf, "%s.%dd: im2col offset %d = %u is past %d", what, rank, i,
                    offsets[i], off_lim - 1);
      trap(buf);
    }
    lo[i] = t.lower[i];
    hi[i] = static_cast<int64_t>(t.dims[i + 1]) - 1 + t.upper[i];
    base[i] = coords[i + 1];
    if (base[i] < lo[i] || base[i] > hi[i]) {
      std::snprintf(buf, sizeof buf,
                    "%s.%dd: the filter base %lld of spatial dimension %d lies outside the "
                    "bounding box [%lld, %lld]",
                    what, rank, static_cast<long long>(base[i]), i, static_cast<long long>(lo[i]),
                    static_cast<long long>(hi[i]));
      trap(buf);
    }
  }
  int64_t img = coords[rank - 1];
  const int64_t cpp = t.box[0], ppc = t.box[1];
  const size_t row = static_cast<size_t>(cpp) * t.elem_bytes;
  Block::Bulk c = new_box(b, dst, bar, row, row * static_cast<size_t>(ppc), swz, what);
  for (int64_t p = 0; p < ppc; ++p) {
    bool in = img >= 0 && img < static_cast<int64_t>(t.dims[rank - 1]);
    uint64_t src = t.address + static_cast<uint64_t>(img) * t.strides[rank - 1];
    for (int i = 0; i < spatial && in; ++i) {
      const int64_t g = base[i] + offsets[i];
      if (g < 0 || g >= static_cast<int64_t>(t.dims[i + 1]))
        in = false;
      else
        src += static_cast<uint64_t>(g) * t.strides[i + 1];
    }
    for (int64_t j = 0; j < cpp && in; ++j) {
      const int64_t ch = int64_t{coords[0]} + j;
      if (ch < 0 || ch >= static_cast<int64_t>(t.dims[0])) continue;  // zeros
      const uint32_t off =
          box_offset(dst, static_cast<uint32_t>((p * cpp + j) * t.elem_bytes), swz);
      std::memcpy(c.image.data() + off,
                  reinterpret_cast<const void*>(src + static_cast<uint64_t>(ch) * t.elem_bytes),
                  t.elem_bytes);
    }
    // The next pixel's filter base: along W, wrapping into H (and D), then the next image.
    int i = 0;
    for (; i < spatial; ++i) {
      base[i] += t.elem_strides[i + 1];
      if (base[i] <= hi[i]) break;
      base[i] = lo[i];
    }
    if (i == spatial) ++img;
  }
  return c;
}

// Copy c lands in block b: now (PLEXUS_EMU_CP_ASYNC=early) or when a thread of b would wait on
// its barrier.
void issue_bulk(Block& b, Block::Bulk c) {
  b.progress = true;
  g_block->progress = true;
  if (cp_async_early())
    land_bulk(b, c);
  else
    b.bulk.push_back(std::move(c));
}

}  // namespace

void tma_load(uint32_t dst, const void* map, const int32_t* coords, int rank, uint32_t bar) {
  issue_bulk(*g_block, tma_box(dst, map, coords, rank, bar, "cp.async.bulk.tensor"));
}

void tma_load_im2col(uint32_t dst, const void* map, const int32_t* coords, int rank,
                     const uint16_t* offsets, uint32_t bar) {
  issue_bulk(*g_block,
             tma_im2col_box(dst, map, coords, rank, offsets, bar, "cp.async.bulk.tensor.im2col"));
}

void tma_load_multicast(uint32_t dst, const void* map, const int32_t* coords, int rank,
                        uint32_t bar, uint16_t mask) {
  const char* what = "cp.async.bulk.tensor.multicast::cluster";
  const Block::Bulk c = tma_box(dst, map, coords, rank, bar, what);
  if (mask == 0) trap("cp.async.bulk.tensor.multicast::cluster: an empty ctaMask");
  // The same box at the same offsets (the data and the mbarrier) in every block of the mask.
  for (unsigned r = 0; r < 16; ++r) {
    if (!(mask & (1u << r))) continue;
    Block& to = cluster_block(r, what);
    (void)shared_at_in(to, dst, c.image.size(), 128, what);
    (void)mbar(to, bar, what);
    issue_bulk(to, c);
  }
}

void tensormap_prefetch(const void* map) {
  (void)tensor_map(map, "prefetch.tensormap");
}

void named_barrier(int id, int count) {
  Block& b = *g_block;
  char buf[200];
  if (id < 1 || id > 15) {
    std::snprintf(buf, sizeof buf,
                  "bar.sync %d, %d: barrier ids are 0 to 15, and 0 with a count is "
                  "not modelled",
                  id, count);
    trap(buf);
  }
  if (count <= 0 || count % kWarp != 0 || count > block_threads()) {
    std::snprintf(buf, sizeof buf,
                  "bar.sync %d, %d: the count must be a multiple of 32, at most the "
                  "block's %d threads",
                  id, count, block_threads());
    trap(buf);
  }
  Block::Named& nb = b.named[id];
  if (nb.arrived == 0)
    nb.count = count;
  else if (nb.count != count) {
    std::snprintf(buf, sizeof buf, "bar.sync %d: threads disagree on the count (%d, %d)", id,
                  nb.count, count);
    trap(buf);
  }
  const unsigned my_gen = nb.gen;
  ++nb.arrived;
  b.progress = true;
  if (nb.arrived == nb.count) {
    nb.arrived = 0;
    ++nb.gen;
  } else {
    do {
      park(b, "bar.sync (named)");
    } while (nb.gen == my_gen);
    b.progress = true;
  }
}

void setmaxnreg(int regs) {
  (void)warpgroup_base("setmaxnreg");
  if (regs < 24 || regs > 256 || regs % 8 != 0)
    trap("setmaxnreg: the register count must be a multiple of 8 from 24 to 256");
}

void wgmma_fence() {
  (void)warpgroup_base("wgmma.fence");
  g_block->wgmma[static_cast<size_t>(g_thread->linear)].fenced = true;
}

void wgmma(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool trans_a, bool trans_b,
           MmaKind kind) {
  Block& b = *g_block;
  const int base = warpgroup_base("wgmma.mma_async");
  Block::Wgmma& w = b.wgmma[static_cast<size_t>(g_thread->linear)];
  if (!w.fenced)
    trap(
        "wgmma.mma_async without a wgmma.fence since the thread started or last waited for its "
        "wgmmas (and may have touched their registers)");
  if (n < 8 || n > 256 || n % 8 != 0 || kind == MmaKind::kTF32)
    trap("wgmma.mma_async: m64nNk16 needs N a multiple of 8 up to 256 and f16 or bf16 inputs");
  // Decoded (and any error reported) at the issue.
  const Block::WgOp op{d, n, desc_a, desc_b, decode_desc(desc_a, trans_a, "A"),
                       decode_desc(desc_b, trans_b, "B"), kind};
  // .aligned: every thread of the warp group issues the same operations.
  std::vector<Block::WgOp>& ops = b.wg_ops[static_cast<size_t>(base / 128)];
  if (w.issued < ops.size()) {
    const Block::WgOp& o = ops[w.issued];
    if (o.n != n || o.da != desc_a || o.db != desc_b || o.a.mn_major != trans_a ||
        o.b.mn_major != trans_b || o.kind != kind)
      trap("wgmma.mma_async: threads of one warp group issue different operations (shape, "
           "descriptors or layouts differ)");
  } else {
    ops.push_back(op);
  }
  w.open.push_back(op);
  ++w.issued;
  b.progress = true;
}

void wgmma_commit() {
  (void)warpgroup_base("wgmma.commit_group");
  Block::Wgmma& w = g_block->wgmma[static_cast<size_t>(g_thread->linear)];
  w.groups.push_back(std::move(w.open));  // an empty group counts, as in PTX
  w.open.clear();
}

void wgmma_wait(int pending) {
  Block& b = *g_block;
  const int base = warpgroup_base("wgmma.wait_group");
  if (pending < 0 || pending > 7) trap("wgmma.wait_group: N must be 0 to 7");
  Block::Wgmma& w = b.wgmma[static_cast<size_t>(g_thread->linear)];
  while (static_cast<int>(w.groups.size()) > pending) {
    // The group's operations run once the whole warp group has issued them: this thread's
    // operations up to the end of the oldest group.
    size_t later = w.open.size();
    for (size_t i = 1; i < w.groups.size(); ++i) later += w.groups[i].size();
    const size_t upto = w.issued - later;
    for (;;) {
      bool all = true;
      for (int t = base; t < base + 128; ++t) {
        if (b.wgmma[static_cast<size_t>(t)].issued >= upto) continue;
        if (b.fibers[static_cast<size_t>(t)].done)
          trap(
              "wgmma.wait_group: a thread of the warp group exited without issuing its part of a "
              "wgmma this thread waits for");
        all = false;
      }
      if (all) break;
      park(b, "wgmma.wait_group");
    }
    // Evaluated now, from shared memory as it is now: a stage refilled before the wait that
    // retires its wgmma changes the result.
    for (const Block::WgOp& op : w.groups.front()) wgmma_evaluate(op);
    w.groups.pop_front();
    b.progress = true;
  }
  w.fenced = false;  // the thread may touch its accumulators now
}

void trap(const char* what) {
  throw std::runtime_error(what);
}

// ---- programmatic dependent launch ----

void grid_dependency_wait() {
  if (!g_thread) trap("cudaGridDependencySynchronize outside a kernel");
  g_block->current->pdl_pending = false;
}
void grid_dependency_trigger() {
  if (!g_thread) trap("cudaTriggerProgrammaticLaunchCompletion outside a kernel");
}
void check_device_access(const char* what, const void* p) {
  if (g_thread && g_block->current->pdl_pending && device_memory(p)) early_device_access(what, p);
}
void early_device_access(const char* what, const void* p) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s of device memory %p by thread (%u,%u,%u) of block (%u,%u,%u) before "
                "cudaGridDependencySynchronize (pdl_wait), in a kernel launched to overlap the "
                "kernel before it: that kernel may still be writing it",
                what, p, g_thread->idx.x, g_thread->idx.y, g_thread->idx.z, g_block_idx.x,
                g_block_idx.y, g_block_idx.z);
  trap(buf);
}

// ---- the runtime ----

namespace {

std::mutex g_mu;  // one launch or API call at a time (the plugin may be driven from threads)
thread_local cudaError_t g_last = cudaSuccess;

constexpr size_t kTotal = size_t{16} << 30;  // the emulated device's memory
size_t g_used = 0;
std::unordered_map<void*, size_t> g_allocs;

struct Capture;
}  // namespace
}  // namespace plx_emu

struct CUstream_st {
  unsigned flags = 0;
  std::shared_ptr<plx_emu::Capture> capture;  // set while captured
};
struct CUevent_st {
  std::chrono::steady_clock::time_point when{};
  bool recorded = false;
  std::shared_ptr<plx_emu::Capture> capture;  // recorded into a capture: waiting on it joins it
};
struct CUgraph_st {
  std::vector<std::function<void()>> work;
  bool programmatic = false;  // a kernel was captured with programmatic stream serialization
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};

namespace plx_emu {
namespace {

struct Capture {
  std::vector<std::function<void()>> work;
  bool programmatic = false;  // a captured launch has programmatic stream serialization
  bool invalid = false;
  std::string why;
  cudaStream_t origin = nullptr;
  std::vector<cudaStream_t> joined;
};
thread_local std::shared_ptr<Capture> g_thread_capture;  // this thread's capture (thread-local mode)

std::map<const void*, int> g_smem_optin;  // kernel -> max dynamic shared memory

cudaError_t fail(cudaError_t e) {
  g_last = e;
  return e;
}

// ---- Faults ----
// A kernel that faults (a trap, a deadlock, an error in one of its threads, an emulated library
// call that throws, or a fault injected by PLEXUS_EMU_FAULT_KERNEL) leaves the context unusable,
// as on a GPU: every later call that touches the device returns the fault (cudaGetLastError
// does not clear it), work queued after it does not run, and only a new process can use the
// device again. Queries of the device and of kernels (properties, names, attributes) still
// answer, as the CUDA runtime's do.
std::atomic<int> g_sticky{cudaSuccess};

// The fault the context is stuck with, also made this thread's last error; cudaSuccess if none.
cudaError_t dead() {
  const auto e = static_cast<cudaError_t>(g_sticky.load());
  if (e != cudaSuccess) g_last = e;
  return e;
}

void fault(cudaError_t e) {
  int none = cudaSuccess;
  g_sticky.compare_exchange_strong(none, e);
  g_last = static_cast<cudaError_t>(g_sticky.load());
}

}  // namespace

// The selftest's hook (selftest.cu, EXPECT_FAULT): forgets the fault so that the selftest can go
// on after a launch that must fail. A process on a GPU cannot.
void clear_fault() {
  g_sticky.store(cudaSuccess);
  g_last = cudaSuccess;
}

namespace {

// PLEXUS_EMU_FAULT_KERNEL=patterns: a launch of a kernel whose name (as traced: "kernel<targs>")
// matches one of the comma-separated shell patterns faults instead of running, with
// cudaErrorIllegalAddress, as a kernel that reads outside its memory does on a GPU: how the host
// takes a fault it cannot recover from (the tuner, backend.check_kernels, tests/gpu/run_lib.sh)
// is tested with it.
bool injected_fault(const std::string& kernel) {
  static const std::vector<std::string> patterns = [] {
    std::vector<std::string> out;
    const char* e = std::getenv("PLEXUS_EMU_FAULT_KERNEL");
    std::string all = e ? e : "";
    for (size_t at = 0; at <= all.size();) {
      const size_t comma = std::min(all.find(',', at), all.size());
      if (comma > at) out.push_back(all.substr(at, comma - at));
      at = comma + 1;
    }
    return out;
  }();
  for (const std::string& p : patterns)
    if (fnmatch(p.c_str(), kernel.c_str(), 0) == 0) return true;
  return false;
}

// An API call that CUDA refuses while this thread captures: invalidates the capture.
bool refused_in_capture(const char* what) {
  if (!g_thread_capture) return false;
  g_thread_capture->invalid = true;
  if (g_thread_capture->why.empty()) g_thread_capture->why = what;
  std::fprintf(stderr, "cuda emulator: %s during a stream capture (the capture is invalidated)\n", what);
  return true;
}

// The order the blocks of a grid run in, one after another (PLEXUS_EMU_BLOCKS): "forward" (x
// fastest, then y, then z: the default), "reverse" (the last block first) or "shuffle" (a fixed
// pseudo-random permutation per launch). The GPU runs blocks in no order it promises, and at
// once. A result that depends on the order reads what another block of the same launch writes
// with nothing between to order the two; and a cross-block reduction whose "last block" is
// taken to be the highest-numbered one, not the last to arrive, is right only in forward order.
Schedule block_schedule() {
  static const Schedule s = schedule_from_env("PLEXUS_EMU_BLOCKS", false);
  return s;
}

// The linear index of the i-th block of `n` to run.
uint64_t block_order(uint64_t i, uint64_t n, uint64_t launch) {
  switch (block_schedule()) {
    case Schedule::kReverse:
      return n - 1 - i;
    case Schedule::kShuffle: {
      // i -> (a i + c) mod n with a coprime to n: a permutation of 0..n-1, another each launch.
      uint64_t a = 2654435761u % n;
      while (std::gcd(a, n) != 1) ++a;
      return (a * i + launch * 40503u) % n;
    }
    default:
      return i;
  }
}

// The grid's clusters run one after another (in the order PLEXUS_EMU_BLOCKS sets), the blocks
// of a cluster together (run_cluster); without clusters each block is a cluster of one.
void run_grid(const char* name, const Config& c, const std::function<void()>& thread) {
  static thread_local uint64_t launches = 0;
  const int nthreads = static_cast<int>(c.block.x * c.block.y * c.block.z);
  const unsigned csize = c.cluster.x * c.cluster.y * c.cluster.z;
  g_cluster.blocks.clear();
  for (unsigned r = 0; r < csize; ++r) {
    Block& b = block(r);
    if (b.fibers.size() < static_cast<size_t>(nthreads)) b.fibers.resize(nthreads);
    b.warps.resize((nthreads + kWarp - 1) / kWarp);
    b.body = &thread;
    b.programmatic = c.programmatic;
    b.fault.clear();
    b.rank = r;
    g_cluster.blocks.push_back(&b);
  }
  ::gridDim = c.grid;
  ::blockDim = c.block;
  // Clusters: cx x cy x cz of them, each of csize blocks (rank x fastest, as %cluster_ctarank).
  const uint64_t cx = c.grid.x / c.cluster.x, cy = c.grid.y / c.cluster.y;
  const uint64_t cxy = cx * cy, n = cxy * (c.grid.z / c.cluster.z);
  ++launches;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t j = block_order(i, n, launches);
    const uint3 first{static_cast<unsigned>(j % cx * c.cluster.x),
                      static_cast<unsigned>(j / cx % cy * c.cluster.y),
                      static_cast<unsigned>(j / cxy * c.cluster.z)};
    for (unsigned r = 0; r < csize; ++r) {
      Block& b = *g_cluster.blocks[r];
      b.idx = {first.x + r % c.cluster.x, first.y + r / c.cluster.x % c.cluster.y,
               first.z + r / (c.cluster.x * c.cluster.y)};
      // Shared memory starts as garbage (NaN in every float type) in every block, not as the
      // block before left it.
      b.smem.assign(c.smem, 0xFF);
    }
    run_cluster(name, nthreads);
  }
}

void run_or_record(cudaStream_t s, std::function<void()> work) {
  if (s && s->capture) s->capture->work.push_back(std::move(work));
  else work();
}

// PLEXUS_EMU_TRACE=file: one line per kernel as it runs (name, grid, block) and per library call
// (its name), to count what a step launches.
FILE* trace_file() {
  static FILE* trace = [] {
    const char* f = std::getenv("PLEXUS_EMU_TRACE");
    return f && *f ? std::fopen(f, "w") : nullptr;
  }();
  return trace;
}

// PLEXUS_EMU_HOST_TRACE=file: one line per operation the host puts on a stream itself (a launch,
// a copy, a memset, a library call, an event record or wait, a graph launch), not those a capture
// records: what a step costs the host and the stream's queue.
void host_trace(cudaStream_t s, const char* what) {
  static FILE* f = [] {
    const char* name = std::getenv("PLEXUS_EMU_HOST_TRACE");
    return name && *name ? std::fopen(name, "w") : nullptr;
  }();
  if (!f || (s && s->capture)) return;
  std::fprintf(f, "%s\n", what);
  std::fflush(f);
}

// Whether [p, p + bytes) lies in memory the runtime allocated (device, pinned or managed).
bool runtime_memory(const void* p, size_t bytes) {
  const auto* q = static_cast<const unsigned char*>(p);
  for (const auto& [base, size] : g_allocs) {
    const auto* b = static_cast<const unsigned char*>(base);
    if (q >= b && q + bytes <= b + size) return true;
  }
  return false;
}

// Names kernels had at their launches, for cudaFuncGetName.
std::map<const void*, std::string> g_kernel_names;
thread_local const char* g_next_launch_name = nullptr;

}  // namespace

// Called from a kernel, with the launch's lock held (blocks run inside submit_launch or a graph's
// replay).
bool device_memory(const void* p) {
  return runtime_memory(p, 1);
}

void name_next_launch(const char* name) {
  g_next_launch_name = name;
}
const char* take_launch_name() {
  const char* n = g_next_launch_name;
  g_next_launch_name = nullptr;
  return n ? n : "cudaLaunchKernelEx";
}

cudaError_t launch_config(const cudaLaunchConfig_t* cfg, Config* out) {
  if (!cfg || (cfg->numAttrs > 0 && !cfg->attrs)) return fail(cudaErrorInvalidValue);
  Config c(cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, cfg->stream);
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    const cudaLaunchAttribute& a = cfg->attrs[i];
    if (a.id == cudaLaunchAttributeIgnore) continue;
    if (a.id == cudaLaunchAttributeClusterDimension) {
      c.cluster = dim3{a.val.clusterDim.x, a.val.clusterDim.y, a.val.clusterDim.z};
      continue;
    }
    if (a.id != cudaLaunchAttributeProgrammaticStreamSerialization) {
      std::fprintf(stderr,
                   "cuda emulator: cudaLaunchKernelEx: launch attribute %d is not modelled\n",
                   static_cast<int>(a.id));
      return fail(cudaErrorInvalidValue);
    }
    c.programmatic = a.val.programmaticStreamSerializationAllowed != 0;
  }
  // Clusters: at most 8 blocks (the portable size; more needs an attribute not modelled), and
  // a grid that is whole clusters.
  const dim3 k = c.cluster;
  const unsigned long long csize = 1ull * k.x * k.y * k.z;
  if (csize == 0 || csize > 8 || c.grid.x % k.x != 0 || c.grid.y % k.y != 0 ||
      c.grid.z % k.z != 0) {
    std::fprintf(stderr,
                 "cuda emulator: cudaLaunchKernelEx: cluster (%u,%u,%u) for grid (%u,%u,%u): a "
                 "cluster is 1 to 8 blocks and the grid a whole number of clusters\n",
                 k.x, k.y, k.z, c.grid.x, c.grid.y, c.grid.z);
    return fail(cudaErrorInvalidValue);
  }
  *out = c;
  return cudaSuccess;
}

cudaError_t submit_launch(const char* name, const void* fn, const Config& c,
                          std::function<void()> thread) {
  std::lock_guard<std::mutex> lock(g_mu);
  host_trace(c.stream, name);
  g_kernel_names.try_emplace(fn, name);
  if (const cudaError_t e = dead()) return e;
  const unsigned long long nthreads = 1ull * c.block.x * c.block.y * c.block.z;
  if (nthreads == 0 || nthreads > 1024 || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 ||
      c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 2147483647u) {
    std::fprintf(stderr, "cuda emulator: %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                 name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
    return fail(cudaErrorInvalidConfiguration);
  }
  const auto opt = g_smem_optin.find(fn);
  const size_t smem_limit = c.smem <= (48u << 10) ? (48u << 10)
                            : opt == g_smem_optin.end() ? (48u << 10)
                                                        : static_cast<size_t>(opt->second);
  if (c.smem > smem_limit || c.smem > (227u << 10)) {
    std::fprintf(stderr,
                 "cuda emulator: %s: %zu bytes of dynamic shared memory, above the %zu the kernel "
                 "may have (more than 48 KiB needs cudaFuncSetAttribute)\n",
                 name, c.smem, smem_limit);
    return fail(cudaErrorInvalidValue);
  }
  if (c.programmatic && c.stream && c.stream->capture) c.stream->capture->programmatic = true;
  FILE* trace = trace_file();
  const Config cfg = c;
  const std::string kernel = name;
  if (trace) {
    run_or_record(c.stream, [trace, cfg, kernel] {
      std::fprintf(trace, "%s grid (%u,%u,%u) block (%u,%u,%u)%s\n", kernel.c_str(), cfg.grid.x,
                   cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z,
                   cfg.programmatic ? " programmatic" : "");
      std::fflush(trace);
    });
  }
  run_or_record(c.stream, [cfg, kernel, thread = std::move(thread)] {
    if (g_sticky.load() != cudaSuccess) return;  // the context is gone: nothing more runs
    if (injected_fault(kernel)) {
      std::fprintf(stderr, "cuda emulator: %s: a fault injected by PLEXUS_EMU_FAULT_KERNEL (an "
                           "illegal address); the context is unusable from here on\n",
                   kernel.c_str());
      fault(cudaErrorIllegalAddress);
      return;
    }
    try {
      run_grid(kernel.c_str(), cfg, thread);
    } catch (const LaunchFault& e) {
      std::fprintf(stderr, "cuda emulator: %s\n", e.what());
      fault(cudaErrorLaunchFailure);
    }
  });
  return cudaSuccess;
}

cudaError_t submit_work(cudaStream_t s, std::function<void()> work, const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
  host_trace(s, what);
  if (const cudaError_t e = dead()) return e;
  run_or_record(s, [work = std::move(work)] {
    if (g_sticky.load() == cudaSuccess) work();
  });
  return cudaSuccess;
}

void submit_library_call(cudaStream_t s, std::function<void()> work, const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  host_trace(s, name);
  const std::string call = name;
  if (FILE* trace = trace_file()) {
    run_or_record(s, [trace, call] {
      std::fprintf(trace, "%s (library)\n", call.c_str());
      std::fflush(trace);
    });
  }
  run_or_record(s, [call, work = std::move(work)] {
    if (g_sticky.load() != cudaSuccess) return;
    try {
      work();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuda emulator: %s: %s\n", call.c_str(), e.what());
      fault(cudaErrorLaunchFailure);
    }
  });
}

}  // namespace plx_emu

using plx_emu::dead;
using plx_emu::fail;
using plx_emu::g_mu;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaError";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (the emulator's message is on stderr)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "error (the emulator's message is on stderr)";
  }
}
cudaError_t cudaGetLastError() {
  if (const cudaError_t e = dead()) return e;  // a fault stays
  const cudaError_t e = plx_emu::g_last;
  plx_emu::g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  if (const cudaError_t e = dead()) return e;
  return plx_emu::g_last;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = 13000;  // the toolkit the plugin is built with here
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                             unsigned long long, cudaDriverEntryPointQueryResult* status) {
  if (!symbol || !fn) return fail(cudaErrorInvalidValue);
  *fn = nullptr;
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  const bool tiled = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  if (tiled || std::strcmp(symbol, "cuTensorMapEncodeIm2col") == 0) {
    if (version >= 12000) {
      *fn = tiled ? reinterpret_cast<void*>(&cuTensorMapEncodeTiled)
                  : reinterpret_cast<void*>(&cuTensorMapEncodeIm2col);
      r = cudaDriverEntryPointSuccess;
    } else {
      r = cudaDriverEntryPointVersionNotSufficent;
    }
  }
  if (status) *status = r;
  return cudaSuccess;
}

namespace {
// The emulated device's SM count: 4, or PLEXUS_EMU_SMS (1 to 1024; anything else is reported).
int emulated_sms() {
  static const int n = [] {
    const char* e = std::getenv("PLEXUS_EMU_SMS");
    if (!e || !*e) return 4;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end || v < 1 || v > 1024) {
      std::fprintf(stderr, "cuda emulator: PLEXUS_EMU_SMS=%s: expected 1 to 1024; using 4\n", e);
      return 4;
    }
    return static_cast<int>(v);
  }();
  return n;
}
}  // namespace

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "CUDA emulator on the CPU (sm_90-like)");
  p->totalGlobalMem = plx_emu::kTotal;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;  // an H100's, 1 KiB of it reserved per block
  p->reservedSharedMemPerBlock = 1 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  // Few "SMs", so that grids sized by the SM count stay small on the CPU; PLEXUS_EMU_SMS sets
  // another count (1 to 1024), so that kernels sized by it run with many more blocks.
  p->multiProcessorCount = emulated_sms();
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = dead()) return e;
  if (plx_emu::refused_in_capture("cudaDeviceSynchronize")) return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

namespace {
cudaError_t allocate(void** p, size_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (const cudaError_t e = dead()) return e;
  if (plx_emu::refused_in_capture(what)) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes > plx_emu::kTotal - plx_emu::g_used) return fail(cudaErrorMemoryAllocation);
  void* q = std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
  if (!q) return fail(cudaErrorMemoryAllocation);
  std::memset(q, 0xFF, bytes);  // fresh device memory is garbage: NaN in every float type
  plx_emu::g_allocs[q] = bytes;
  plx_emu::g_used += bytes;
  *p = q;
  return cudaSuccess;
}
cudaError_t release(void* p, const char* what) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  if (plx_emu::refused_in_capture(what)) return fail(cudaErrorStreamCaptureUnsupported);
  const auto it = plx_emu::g_allocs.find(p);
  if (it == plx_emu::g_allocs.end()) {
    std::fprintf(stderr, "cuda emulator: %s of a pointer it did not allocate\n", what);
    return fail(cudaErrorInvalidValue);
  }
  plx_emu::g_used -= it->second;
  plx_emu::g_allocs.erase(it);
  std::free(p);
  return dead();  // freed, but the call still reports the context's fault
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, "cudaMalloc"); }
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned) {
  return allocate(p, bytes, "cudaMallocManaged");
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return allocate(p, bytes, "cudaHostAlloc"); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocate(p, bytes, "cudaMallocHost"); }
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned) {
  *dev = host;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) { return release(p, "cudaFree"); }
cudaError_t cudaFreeHost(void* p) { return release(p, "cudaFreeHost"); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (const cudaError_t e = dead()) return e;
  std::lock_guard<std::mutex> lock(g_mu);
  *free_bytes = plx_emu::kTotal - plx_emu::g_used;
  *total_bytes = plx_emu::kTotal;
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (const cudaError_t e = dead()) return e;
  if (plx_emu::refused_in_capture("cudaMemcpy")) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  {
    // A graph's copy node takes device, pinned or managed memory; a copy from or to pageable
    // memory is left out of captures here (refused, and the capture invalidated).
    std::lock_guard<std::mutex> lock(g_mu);
    if (s && s->capture && (!plx_emu::runtime_memory(dst, bytes) || !plx_emu::runtime_memory(src, bytes))) {
      s->capture->invalid = true;
      if (s->capture->why.empty()) s->capture->why = "cudaMemcpyAsync of pageable host memory";
      std::fprintf(stderr, "cuda emulator: cudaMemcpyAsync of pageable host memory during a stream capture\n");
      return fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  return plx_emu::submit_work(s, [=] { std::memmove(dst, src, bytes); }, "cudaMemcpyAsync");
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  return plx_emu::submit_work(s, [=] { std::memset(dst, value, bytes); }, "cudaMemsetAsync");
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (const cudaError_t e = dead()) return e;
  if (plx_emu::refused_in_capture("cudaMemset")) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (const cudaError_t e = dead()) return e;
  *s = new CUstream_st;
  (*s)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return dead();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (const cudaError_t e = dead()) return e;
  if ((s && s->capture) || plx_emu::refused_in_capture("cudaStreamSynchronize")) {
    if (s && s->capture) {
      s->capture->invalid = true;
      s->capture->why = "cudaStreamSynchronize on the captured stream";
    }
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (const cudaError_t err = dead()) return err;
  std::lock_guard<std::mutex> lock(g_mu);
  plx_emu::host_trace(s, "cudaStreamWaitEvent");
  // Waiting on an event recorded in a capture pulls the stream into that capture, as in CUDA.
  if (s && e->capture && !s->capture) {
    s->capture = e->capture;
    e->capture->joined.push_back(s);
  }
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  if (const cudaError_t err = dead()) return err;
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return dead();
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (const cudaError_t err = dead()) return err;
  std::lock_guard<std::mutex> lock(g_mu);
  plx_emu::host_trace(s, "cudaEventRecord");
  if (s && s->capture) {
    e->capture = s->capture;
    // Timing events inside a graph take their time when the graph runs that far.
    s->capture->work.push_back([e] {
      e->when = std::chrono::steady_clock::now();
      e->recorded = true;
    });
    return cudaSuccess;
  }
  e->capture = nullptr;
  e->when = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (const cudaError_t err = dead()) return err;
  if (e->capture || plx_emu::refused_in_capture("cudaEventSynchronize"))
    return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (const cudaError_t err = dead()) return err;
  if (e->capture) return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (const cudaError_t err = dead()) return err;
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (const cudaError_t e = dead()) return e;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!s || s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<plx_emu::Capture>();
  c->origin = s;
  s->capture = c;
  plx_emu::g_thread_capture = c;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!s || !s->capture || s->capture->origin != s) return fail(cudaErrorIllegalState);
  auto c = s->capture;
  for (cudaStream_t j : c->joined) j->capture = nullptr;
  s->capture = nullptr;
  plx_emu::g_thread_capture = nullptr;
  if (const cudaError_t e = dead()) {
    *graph = nullptr;
    return e;
  }
  if (c->invalid) {
    std::fprintf(stderr, "cuda emulator: the capture was invalidated by %s\n", c->why.c_str());
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(c->work), c->programmatic};
  return cudaSuccess;
}
// PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS=1: instantiating a graph with a programmatic launch in
// it fails (cudaErrorNotSupported), as a driver that refused programmatic edges would; a fault
// no GPU has been seen to make, modelled so that the way round it (the CUDA plugin's
// programmatic_launch option, tests/gpu/run_owed.sh's retry) is tested.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (const cudaError_t e = dead()) return e;
  if (!graph) return fail(cudaErrorInvalidValue);
  static const bool refuse = [] {
    const char* e = std::getenv("PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS");
    return e && *e && std::string(e) != "0";
  }();
  if (refuse && graph->programmatic) {
    std::fprintf(stderr, "cuda emulator: cudaGraphInstantiate refuses the graph's programmatic "
                         "launches (PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS)\n");
    return fail(cudaErrorNotSupported);
  }
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (const cudaError_t e = dead()) return e;
  if (!exec) return fail(cudaErrorInvalidValue);
  std::unique_lock<std::mutex> lock(g_mu);
  plx_emu::host_trace(s, "cudaGraphLaunch");
  if (s && s->capture) {
    s->capture->work.push_back([exec] {
      for (const auto& w : exec->work) w();
    });
    return cudaSuccess;
  }
  for (const auto& w : exec->work) w();
  return plx_emu::g_last;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* fn, cudaFuncAttribute attr, int value) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > (227 << 10)) return fail(cudaErrorInvalidValue);
    plx_emu::g_smem_optin[fn] = value;
  }
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, const void* fn,
                                           const cudaLaunchConfig_t* config) {
  if (!clusters || !fn || !config) return fail(cudaErrorInvalidValue);
  // The configuration's cluster attribute (the kernel has no cluster dimensions of its own).
  const cudaLaunchAttribute* cl = nullptr;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) cl = &config->attrs[i];
  if (!cl) return fail(cudaErrorInvalidValue);
  cudaLaunchConfig_t probe = *config;
  probe.gridDim = dim3{cl->val.clusterDim.x, cl->val.clusterDim.y, cl->val.clusterDim.z};
  plx_emu::Config c(dim3{}, dim3{});
  if (const cudaError_t e = plx_emu::launch_config(&probe, &c); e != cudaSuccess) return e;
  const int csize = static_cast<int>(c.cluster.x * c.cluster.y * c.cluster.z);
  // Blocks an SM holds: an H100's 228 KiB of shared memory (1 KiB of it reserved per block) and
  // 2,048 threads (registers are not modelled).
  const unsigned long long threads = 1ull * c.block.x * c.block.y * c.block.z;
  const unsigned long long per_sm =
      std::min<unsigned long long>((228u << 10) / (c.smem + 1024), 2048 / std::max(threads, 1ull));
  *clusters = static_cast<int>(static_cast<unsigned long long>(emulated_sms()) * per_sm /
                               static_cast<unsigned long long>(csize));
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* fn) {
  if (!attr || !fn) return fail(cudaErrorInvalidValue);
  static const int ptx = [] {
    const char* e = std::getenv("PLEXUS_EMU_PTX_VERSION");
    return e && *e ? std::atoi(e) : 90;
  }();
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  attr->ptxVersion = ptx;
  attr->binaryVersion = 90;
  std::lock_guard<std::mutex> lock(g_mu);
  const auto opt = plx_emu::g_smem_optin.find(fn);
  attr->maxDynamicSharedSizeBytes = opt == plx_emu::g_smem_optin.end() ? 48 << 10 : opt->second;
  return cudaSuccess;
}
cudaError_t cudaFuncGetName(const char** name, const void* fn) {
  if (!name || !fn) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = plx_emu::g_kernel_names.find(fn);
  if (it == plx_emu::g_kernel_names.end()) return fail(cudaErrorInvalidValue);
  *name = it->second.c_str();
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(g_mu);
  *status = !s || !s->capture    ? cudaStreamCaptureStatusNone
            : s->capture->invalid ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
  std::swap(current, *mode);
  return cudaSuccess;
}
