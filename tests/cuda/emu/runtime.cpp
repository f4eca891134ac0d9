// The CUDA emulator's runtime (tests/cuda/emu/README.md): fibers for CUDA threads, barriers and
// warp exchanges between them, and the runtime API on host memory with stream capture.
#include <sys/mman.h>

#include <algorithm>
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

namespace plx_emu {

thread_local Thread* g_thread = nullptr;
thread_local uint3 g_block_idx{0, 0, 0};
thread_local dim3 g_block_dim{1, 1, 1};
thread_local dim3 g_grid_dim{1, 1, 1};

namespace {

constexpr size_t kStack = size_t{256} << 10;  // per CUDA thread; the pages are touched on use
constexpr int kMaxThreads = 1024;
constexpr size_t kSlot = 32;  // bytes a lane offers at a warp meeting (an mma's A and B fragments)

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
  const char* where = "";
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

  Block() {
    void* p = mmap(nullptr, kStack * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    stacks = static_cast<char*>(p);
  }
  ~Block() { munmap(stacks, kStack * kMaxThreads); }
};

thread_local Block* g_block = nullptr;

Block& block() {
  if (!g_block) g_block = new Block();  // kept for the thread's life (its stacks are reused)
  return *g_block;
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
  } catch (const std::exception& e) {
    if (b.fault.empty()) b.fault = e.what();
  } catch (...) {
    if (b.fault.empty()) b.fault = "a CUDA thread threw";
  }
  f->done = true;
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
Schedule schedule() {
  static const Schedule s = [] {
    const char* e = std::getenv("PLEXUS_EMU_SCHEDULE");
    const std::string v = e ? e : "";
    if (v == "reverse") return Schedule::kReverse;
    if (v == "shuffle") return Schedule::kShuffle;
    if (v == "ahead") return Schedule::kAhead;
    if (!v.empty() && v != "forward")
      std::fprintf(stderr, "cuda emulator: PLEXUS_EMU_SCHEDULE=%s: expected forward, reverse, "
                           "shuffle or ahead; running forward\n", v.c_str());
    return Schedule::kForward;
  }();
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

void run_block(Block& b, const char* name, int nthreads) {
  b.live = nthreads;
  b.arrived = 0;
  b.acc = 0;
  for (auto& w : b.warps) w.arrived = 0, w.mask = 0;
  b.async.resize(static_cast<size_t>(nthreads));
  for (auto& a : b.async) a.open.clear(), a.groups.clear();
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.waiting = false;
    f.thread.linear = t;
    f.thread.idx = {t % g_block_dim.x, (t / g_block_dim.x) % g_block_dim.y,
                    t / (g_block_dim.x * g_block_dim.y)};
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
  const int nwarps = (nthreads + kWarp - 1) / kWarp;
  const bool ahead = schedule() == Schedule::kAhead;
  while (b.live > 0) {
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
    if (!b.progress && b.live > 0)
      throw LaunchFault("deadlock in " + describe(b, name) +
                        ": a barrier that some threads of the block never reach");
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

// The lanes of `mask` meet; returns the bank of slots written before the meeting.
int warp_meet(Block& b, unsigned mask, const void* mine, size_t bytes, const char* what) {
  const int lane = lane_id(), w = g_thread->linear / kWarp;
  Block::Warp& warp = b.warps[w];
  const int nthreads = static_cast<int>(g_block_dim.x * g_block_dim.y * g_block_dim.z);
  const int lanes_here = std::min(kWarp, nthreads - w * kWarp);
  const unsigned exists = lanes_here == kWarp ? ~0u : (1u << lanes_here) - 1u;
  if (!(mask & (1u << lane))) trap((std::string(what) + " called by a lane outside its mask").c_str());
  if (mask & ~exists) trap((std::string(what) + ": the mask names lanes the block does not have").c_str());
  for (int l = 0; l < kWarp; ++l)
    if ((mask & (1u << l)) && b.fibers[w * kWarp + l].done)
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
      for (int l = 0; l < kWarp; ++l)
        if ((mask & (1u << l)) && b.fibers[w * kWarp + l].done)
          trap((std::string(what) + ": the mask names a lane that has exited").c_str());
    }
    b.progress = true;
  }
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
  const int nthreads = static_cast<int>(g_block_dim.x * g_block_dim.y * g_block_dim.z);
  if (nthreads - w * kWarp < kWarp)
    trap((std::string(what) + ": the warp has fewer than 32 threads (the block size is not a "
                              "multiple of 32), but the instruction needs all of them").c_str());
  return ~0u;
}

// The bytes at shared address `addr` (an offset into the launch's dynamic shared memory).
unsigned char* shared_at(uint32_t addr, size_t bytes, size_t align, const char* what) {
  Block& b = *g_block;
  if (addr % align != 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: shared address %u is not %zu-byte aligned", what, addr, align);
    trap(buf);
  }
  if (static_cast<size_t>(addr) + bytes > b.smem.size()) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s: shared address %u + %zu bytes is past the launch's %zu bytes of dynamic "
                  "shared memory", what, addr, bytes, b.smem.size());
    trap(buf);
  }
  return b.smem.data() + addr;
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

uint32_t shared_address(const void* p) {
  Block& b = *g_block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (b.smem.empty() || c < b.smem.data() || c > b.smem.data() + b.smem.size())
    trap("__cvta_generic_to_shared: the emulator maps only the launch's dynamic shared memory "
         "(extern __shared__) to shared addresses");
  return static_cast<uint32_t>(c - b.smem.data());
}

void cp_async(uint32_t dst, const void* src, int bytes, int src_bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16) trap("cp.async: the copy size must be 4, 8 or 16");
  if (src_bytes < 0 || src_bytes > bytes) trap("cp.async: src-size past the copy size");
  if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0)
    trap("cp.async: the global source is not aligned to the copy size");
  Block::AsyncCopy c{shared_at(dst, static_cast<size_t>(bytes), static_cast<size_t>(bytes), "cp.async"),
                     {}, bytes};  // data zeroed: the zero fill past src_bytes
  if (src_bytes > 0) std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  if (cp_async_early()) land({c});
  else g_block->async[static_cast<size_t>(g_thread->linear)].open.push_back(c);
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

void mma(float* c, const uint32_t* a, const uint32_t* bf, MmaKind kind) {
  Block& b = *g_block;
  const unsigned mask = whole_warp("mma.sync");
  uint32_t mine[6] = {a[0], a[1], a[2], a[3], bf[0], bf[1]};
  const int bank = warp_meet(b, mask, mine, sizeof mine, "mma.sync");
  const auto& slot = b.warps[g_thread->linear / kWarp].slot[bank];
  auto reg = [&](int lane, int j) {
    uint32_t v;
    std::memcpy(&v, slot[lane] + 4 * j, sizeof v);
    return v;
  };
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
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  const int K = kind == MmaKind::kTF32 ? 8 : 16;
  double A[2][16], B[16][2];
  for (int h = 0; h < 2; ++h) {
    const int row = g + 8 * h;
    for (int k = 0; k < K; ++k) {
      if (kind == MmaKind::kTF32) {
        // a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4].
        A[h][k] = tf32_value(reg((row % 8) * 4 + k % 4, (row / 8) + 2 * (k / 4)));
      } else {
        // Register j of lane (g', t'): A[g' + 8 (j % 2)][2t' + 8 (j / 2) + {0, 1}].
        A[h][k] = half_value(reg((row % 8) * 4 + (k % 8) / 2, (row / 8) + 2 * (k / 8)), k % 2);
      }
    }
  }
  for (int e = 0; e < 2; ++e) {
    const int col = 2 * t + e;
    for (int k = 0; k < K; ++k) {
      if (kind == MmaKind::kTF32) {
        // b0 = B[t'][g'], b1 = B[t' + 4][g'] (registers 4 and 5 of the meeting).
        B[k][e] = tf32_value(reg(col * 4 + k % 4, 4 + k / 4));
      } else {
        // Register j of lane (g', t'): B[2t' + 8j + {0, 1}][g'].
        B[k][e] = half_value(reg(col * 4 + (k % 8) / 2, 4 + k / 8), k % 2);
      }
    }
  }
  // The products are exact in double; the sum is rounded once, to f32, with c.
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) {
      double s = c[2 * h + e];
      for (int k = 0; k < K; ++k) s += A[h][k] * B[k][e];
      c[2 * h + e] = static_cast<float>(s);
    }
}

void trap(const char* what) { throw std::runtime_error(what); }

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
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};

namespace plx_emu {
namespace {

struct Capture {
  std::vector<std::function<void()>> work;
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

// An API call that CUDA refuses while this thread captures: invalidates the capture.
bool refused_in_capture(const char* what) {
  if (!g_thread_capture) return false;
  g_thread_capture->invalid = true;
  if (g_thread_capture->why.empty()) g_thread_capture->why = what;
  std::fprintf(stderr, "cuda emulator: %s during a stream capture (the capture is invalidated)\n", what);
  return true;
}

void run_grid(const char* name, const Config& c, const std::function<void()>& thread) {
  Block& b = block();
  const int nthreads = static_cast<int>(c.block.x * c.block.y * c.block.z);
  if (b.fibers.size() < static_cast<size_t>(nthreads)) b.fibers.resize(nthreads);
  b.warps.resize((nthreads + kWarp - 1) / kWarp);
  b.smem.assign(c.smem, 0xFF);  // shared memory starts as garbage: NaN in every float type
  b.body = &thread;
  b.fault.clear();
  g_grid_dim = c.grid;
  g_block_dim = c.block;
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) {
        g_block_idx = {x, y, z};
        run_block(b, name, nthreads);
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

}  // namespace

void submit_launch(const char* name, const void* fn, const Config& c, std::function<void()> thread) {
  std::lock_guard<std::mutex> lock(g_mu);
  const unsigned long long nthreads = 1ull * c.block.x * c.block.y * c.block.z;
  if (nthreads == 0 || nthreads > 1024 || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 ||
      c.grid.z == 0 || c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 2147483647u) {
    std::fprintf(stderr, "cuda emulator: %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                 name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
    fail(cudaErrorInvalidConfiguration);
    return;
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
    fail(cudaErrorInvalidValue);
    return;
  }
  FILE* trace = trace_file();
  const Config cfg = c;
  const std::string kernel = name;
  if (trace) {
    run_or_record(c.stream, [trace, cfg, kernel] {
      std::fprintf(trace, "%s grid (%u,%u,%u) block (%u,%u,%u)\n", kernel.c_str(), cfg.grid.x,
                   cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z);
      std::fflush(trace);
    });
  }
  run_or_record(c.stream, [cfg, kernel, thread = std::move(thread)] {
    try {
      run_grid(kernel.c_str(), cfg, thread);
    } catch (const LaunchFault& e) {
      std::fprintf(stderr, "cuda emulator: %s\n", e.what());
      g_last = cudaErrorLaunchFailure;
    }
  });
}

cudaError_t submit_work(cudaStream_t s, std::function<void()> work, const char*) {
  std::lock_guard<std::mutex> lock(g_mu);
  run_or_record(s, std::move(work));
  return cudaSuccess;
}

void submit_library_call(cudaStream_t s, std::function<void()> work, const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  const std::string call = name;
  if (FILE* trace = trace_file()) {
    run_or_record(s, [trace, call] {
      std::fprintf(trace, "%s (library)\n", call.c_str());
      std::fflush(trace);
    });
  }
  run_or_record(s, [call, work = std::move(work)] {
    try {
      work();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuda emulator: %s: %s\n", call.c_str(), e.what());
      g_last = cudaErrorLaunchFailure;
    }
  });
}

}  // namespace plx_emu

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
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaError";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (the emulator's message is on stderr)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "error (the emulator's message is on stderr)";
  }
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = plx_emu::g_last;
  plx_emu::g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return plx_emu::g_last; }
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

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "CUDA emulator on the CPU (sm_90-like)");
  p->totalGlobalMem = plx_emu::kTotal;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 4;  // few "SMs": grids sized by SM count stay small on the CPU
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (plx_emu::refused_in_capture("cudaDeviceSynchronize")) return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

namespace {
cudaError_t allocate(void** p, size_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
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
  return cudaSuccess;
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
  std::lock_guard<std::mutex> lock(g_mu);
  *free_bytes = plx_emu::kTotal - plx_emu::g_used;
  *total_bytes = plx_emu::kTotal;
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (plx_emu::refused_in_capture("cudaMemcpy")) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  return plx_emu::submit_work(s, [=] { std::memmove(dst, src, bytes); }, "cudaMemcpyAsync");
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  return plx_emu::submit_work(s, [=] { std::memset(dst, value, bytes); }, "cudaMemsetAsync");
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (plx_emu::refused_in_capture("cudaMemset")) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st;
  (*s)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
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
  std::lock_guard<std::mutex> lock(g_mu);
  // Waiting on an event recorded in a capture pulls the stream into that capture, as in CUDA.
  if (s && e->capture && !s->capture) {
    s->capture = e->capture;
    e->capture->joined.push_back(s);
  }
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
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
  if (e->capture || plx_emu::refused_in_capture("cudaEventSynchronize"))
    return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e->capture) return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
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
  if (c->invalid) {
    std::fprintf(stderr, "cuda emulator: the capture was invalidated by %s\n", c->why.c_str());
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(c->work)};
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return fail(cudaErrorInvalidValue);
  std::unique_lock<std::mutex> lock(g_mu);
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
