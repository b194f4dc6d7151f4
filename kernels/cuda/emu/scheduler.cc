#include "kernels/cuda/emu/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/emu/fiber.h"
#include "kernels/cuda/emu/fp_types.h"

namespace sluice::emu {
namespace {

// Deep enough for kernels with a few KiB of registers' worth of locals under ASan's redzones.
constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarpSize = 32;
constexpr unsigned char kPoisonByte = 0xff;

enum class Wait { kRunnable, kBarrier, kWarp, kDone };

// One cp.async of 4, 8 or 16 bytes: its source bytes as read when it was issued.
struct PendingCopy {
  uint8_t* dst;
  size_t bytes;
  uint8_t data[16];
};

struct EmuThread {
  ThreadIndex index;
  int linear = 0;
  Wait wait = Wait::kRunnable;
  const char* file = nullptr;  // where it waits
  int line = 0;
  // Barrier with a reduction.
  int predicate = 0;
  int reduce_result = 0;
  // Warp collective.
  unsigned mask = 0;
  WarpOp op = WarpOp::kSync;
  uint64_t value = 0;
  int arg = 0;
  int width = kWarpSize;
  uint64_t result = 0;
  // mma.sync: the lane's A and B fragments and its C, then D.
  uint32_t mma_ab[6] = {};
  float mma_cd[4] = {};
  // Asynchronous copies: the open group, then committed groups, oldest first.
  std::vector<PendingCopy> open;
  std::deque<std::vector<PendingCopy>> committed;
  Fiber* fiber = nullptr;
};

struct SharedAllocation {
  const void* tag;
  uint8_t* data;
  size_t bytes;
};

struct BlockRun {
  const GridSpec* spec = nullptr;
  uint3 block_idx{};
  ThreadOrder order = ThreadOrder::kForward;
  std::vector<EmuThread> threads;
  uint8_t* dynamic_shared = nullptr;
  std::vector<SharedAllocation> statics;
  BlockReduceOp reduce_op = BlockReduceOp::kCount;
  // Addresses TSan synchronizes on: [0] the block barrier, [1 + w] warp w. Fresh per block so
  // that blocks stay unordered with respect to each other, as on the device.
  std::unique_ptr<char[]> sync;
};

thread_local EmuThread* g_current = nullptr;
BlockRun* g_block = nullptr;
std::mutex g_grid_mutex;  // one grid runs at a time in the process
char g_launch_sync;       // host -> every thread of a launch
char g_end_sync;          // every thread of a launch -> host
uint64_t g_launches = 0;

const char* OrderName(ThreadOrder o) {
  switch (o) {
    case ThreadOrder::kForward:
      return "forward";
    case ThreadOrder::kReverse:
      return "reverse";
    case ThreadOrder::kRandom:
      return "random";
    case ThreadOrder::kMixed:
      return "mixed";
  }
  return "?";
}

// The emulation's own bookkeeping done on a fiber's behalf (vectors growing, queues of copies
// shrinking): invisible to TSan, which would otherwise order or race it against the kernel.
class Untracked {
 public:
  Untracked() { TsanIgnoreBegin(); }
  ~Untracked() { TsanIgnoreEnd(); }
  Untracked(const Untracked&) = delete;
  Untracked& operator=(const Untracked&) = delete;
};

// Fresh shared memory for one block, filled with poison. Neither the allocation nor the fill is
// an access by a thread of the block (TSan would otherwise order them against the block).
uint8_t* AllocateShared(size_t bytes, size_t align) {
  void* p = nullptr;
  TsanIgnoreBegin();
  const int err = posix_memalign(&p, std::max<size_t>(align, 16), bytes == 0 ? 1 : bytes);
  if (err == 0) std::memset(p, kPoisonByte, bytes);
  TsanIgnoreEnd();
  if (err != 0) {
    Fault(absl::StrFormat("cannot allocate %d bytes of shared memory on the host", bytes));
  }
  return static_cast<uint8_t*>(p);
}

EmuThread& Current(const char* what) {
  if (g_current == nullptr) Fault(absl::StrFormat("%s called outside a kernel", what));
  return *g_current;
}

std::string Describe(const EmuThread& t) {
  const uint3& i = t.index.thread_idx;
  return absl::StrFormat("thread (%d,%d,%d)", i.x, i.y, i.z);
}

bool IsShared(const BlockRun& b, const void* p, size_t bytes) {
  const auto* q = static_cast<const uint8_t*>(p);
  auto within = [&](const uint8_t* base, size_t n) { return q >= base && q + bytes <= base + n; };
  if (within(b.dynamic_shared, b.spec->dynamic_shared_bytes)) return true;
  for (const SharedAllocation& s : b.statics) {
    if (within(s.data, s.bytes)) return true;
  }
  return false;
}

void Land(const std::vector<PendingCopy>& group) {
  for (const PendingCopy& c : group) std::memcpy(c.dst, c.data, c.bytes);
}

void ThreadMain(void* arg) {
  EmuThread& t = *static_cast<EmuThread*>(arg);
  TsanAcquire(&g_launch_sync);
  g_block->spec->body();
  TsanRelease(&g_end_sync);
  t.wait = Wait::kDone;
  t.fiber->Finish();
}

std::vector<std::unique_ptr<Fiber>>& FiberPool() {
  static auto* pool = new std::vector<std::unique_ptr<Fiber>>();
  return *pool;
}

// D = A B + C of one m16n8k16 mma over the 32 lanes starting at `lane0`, fragments in PTX's
// layout (groupID g = lane / 4, t = lane % 4): A rows g and g + 8, columns 2t, 2t + 1 (+ 8);
// B rows 2t, 2t + 1 (+ 8), column g; C/D rows g and g + 8, columns 2t, 2t + 1.
void ResolveMma(EmuThread* lane0) {
  float a[16][16], bm[16][8], c[16][8];
  const auto half = [](uint32_t r, int hi) {
    return HalfBitsToFloat(static_cast<uint16_t>(hi ? r >> 16 : r & 0xffff));
  };
  for (int k = 0; k < kWarpSize; ++k) {
    const EmuThread& l = lane0[k];
    const int g = k / 4, t = k % 4;
    for (int j = 0; j < 2; ++j) {
      a[g][2 * t + j] = half(l.mma_ab[0], j);
      a[g + 8][2 * t + j] = half(l.mma_ab[1], j);
      a[g][2 * t + 8 + j] = half(l.mma_ab[2], j);
      a[g + 8][2 * t + 8 + j] = half(l.mma_ab[3], j);
      bm[2 * t + j][g] = half(l.mma_ab[4], j);
      bm[2 * t + 8 + j][g] = half(l.mma_ab[5], j);
      c[g][2 * t + j] = l.mma_cd[j];
      c[g + 8][2 * t + j] = l.mma_cd[2 + j];
    }
  }
  for (int k = 0; k < kWarpSize; ++k) {
    EmuThread& l = lane0[k];
    const int g = k / 4, t = k % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
      float sum = c[row][col];
      for (int kk = 0; kk < 16; ++kk) sum = std::fma(a[row][kk], bm[kk][col], sum);
      l.mma_cd[i] = sum;
    }
    l.result = 0;
    l.wait = Wait::kRunnable;
  }
}

// Releases every warp collective whose named lanes have all arrived. Returns whether any did.
bool ReleaseWarps(BlockRun& b) {
  bool released = false;
  const int n = static_cast<int>(b.threads.size());
  for (int w0 = 0; w0 < n; w0 += kWarpSize) {
    const int lanes = std::min(kWarpSize, n - w0);
    for (int l = 0; l < lanes; ++l) {
      EmuThread& first = b.threads[w0 + l];
      if (first.wait != Wait::kWarp) continue;
      const unsigned mask = first.mask;
      bool ready = true;
      for (int k = 0; k < kWarpSize && ready; ++k) {
        if (!(mask >> k & 1)) continue;
        if (k >= lanes) {
          g_current = &first;
          Fault(absl::StrFormat(
              "warp collective at %s:%d names lane %d in mask 0x%08x, but the block has only %d "
              "threads in this warp",
              first.file, first.line, k, mask, lanes));
        }
        const EmuThread& o = b.threads[w0 + k];
        if (o.wait == Wait::kDone) {
          g_current = &first;
          Fault(absl::StrFormat(
              "warp collective at %s:%d names lane %d in mask 0x%08x, which has exited", first.file,
              first.line, k, mask));
        }
        if (o.wait != Wait::kWarp) ready = false;
      }
      if (!ready) continue;
      if (!(mask >> l & 1)) {
        g_current = &first;
        Fault(absl::StrFormat("warp collective at %s:%d with mask 0x%08x omits the calling lane %d",
                              first.file, first.line, mask, l));
      }
      for (int k = 0; k < kWarpSize; ++k) {
        if (!(mask >> k & 1)) continue;
        const EmuThread& o = b.threads[w0 + k];
        if (o.mask != mask || o.op != first.op) {
          g_current = &first;
          Fault(absl::StrFormat(
              "lanes of a warp meet at different collectives: lane %d at %s:%d (mask 0x%08x), "
              "lane %d at %s:%d (mask 0x%08x)",
              l, first.file, first.line, mask, k, o.file, o.line, o.mask));
        }
      }
      if (first.op == WarpOp::kMma) {
        if (mask != 0xffffffffu || lanes != kWarpSize) {
          g_current = &first;
          Fault(absl::StrFormat("mma.sync at %s:%d needs the whole warp (mask 0x%08x, %d lanes)",
                                first.file, first.line, mask, lanes));
        }
        ResolveMma(&b.threads[w0]);
        released = true;
        continue;
      }
      unsigned ballot = 0;
      int votes = 0, members = 0;
      for (int k = 0; k < kWarpSize; ++k) {
        if (!(mask >> k & 1)) continue;
        ++members;
        if (b.threads[w0 + k].value != 0) {
          ballot |= 1u << k;
          ++votes;
        }
      }
      for (int k = 0; k < kWarpSize; ++k) {
        if (!(mask >> k & 1)) continue;
        EmuThread& t = b.threads[w0 + k];
        const int width = t.width;
        if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0) {
          g_current = &t;
          Fault(absl::StrFormat("shuffle width %d at %s:%d is not a power of two up to 32", width,
                                t.file, t.line));
        }
        const int seg = k & ~(width - 1);
        int src = k;
        switch (t.op) {
          case WarpOp::kShflIdx:
            src = seg + (t.arg & (width - 1));
            break;
          case WarpOp::kShflUp:
            src = (k - seg) >= t.arg ? k - t.arg : k;
            break;
          case WarpOp::kShflDown:
            src = (k - seg) + t.arg < width ? k + t.arg : k;
            break;
          case WarpOp::kShflXor:
            src = k ^ t.arg;
            if (src < seg || src >= seg + width) src = k;
            break;
          default:
            break;
        }
        switch (t.op) {
          case WarpOp::kSync:
            t.result = 0;
            break;
          case WarpOp::kBallot:
            t.result = ballot;
            break;
          case WarpOp::kAny:
            t.result = votes > 0;
            break;
          case WarpOp::kAll:
            t.result = votes == members;
            break;
          default:
            // A source lane outside the mask gives an undefined value: poison.
            t.result = (src >= 0 && src < kWarpSize && (mask >> src & 1))
                           ? b.threads[w0 + src].value
                           : ~uint64_t{0};
            break;
        }
        t.wait = Wait::kRunnable;
      }
      released = true;
    }
  }
  return released;
}

// Releases the block barrier when every thread that has not exited waits at it.
bool ReleaseBarrier(BlockRun& b) {
  const EmuThread* first = nullptr;
  int arrived = 0, count = 0;
  for (const EmuThread& t : b.threads) {
    if (t.wait == Wait::kDone) continue;
    if (t.wait != Wait::kBarrier) return false;
    if (first == nullptr) first = &t;
    if (t.line != first->line || std::strcmp(t.file, first->file) != 0) {
      g_current = const_cast<EmuThread*>(&t);
      Fault(absl::StrFormat(
          "threads of one block wait at different barriers: %s at %s:%d, %s at %s:%d",
          Describe(*first), first->file, first->line, Describe(t), t.file, t.line));
    }
    ++arrived;
    if (t.predicate != 0) ++count;
  }
  if (first == nullptr) return false;
  int result = count;
  if (b.reduce_op == BlockReduceOp::kAnd) result = count == arrived;
  if (b.reduce_op == BlockReduceOp::kOr) result = count > 0;
  for (EmuThread& t : b.threads) {
    if (t.wait != Wait::kBarrier) continue;
    t.reduce_result = result;
    t.wait = Wait::kRunnable;
  }
  return true;
}

[[noreturn]] void Deadlock(BlockRun& b) {
  std::string what;
  int shown = 0;
  for (EmuThread& t : b.threads) {
    if (t.wait == Wait::kDone || shown >= 8) continue;
    ++shown;
    absl::StrAppendFormat(&what, "\n  %s waits at %s %s:%d", Describe(t),
                          t.wait == Wait::kBarrier ? "__syncthreads" : "a warp collective at",
                          t.file, t.line);
    if (t.wait == Wait::kWarp) absl::StrAppendFormat(&what, " (mask 0x%08x)", t.mask);
  }
  g_current = nullptr;
  Fault("deadlock: no thread of the block can proceed" + what);
}

void RunBlock(BlockRun& b, std::mt19937_64& rng) {
  const int n = static_cast<int>(b.threads.size());
  std::vector<std::unique_ptr<Fiber>>& pool = FiberPool();
  for (int i = 0; i < n; ++i) {
    EmuThread& t = b.threads[i];
    t.wait = Wait::kRunnable;
    {
      Untracked untracked;
      t.open.clear();
      t.committed.clear();
    }
    t.fiber = pool[i].get();
    t.fiber->Restart(&ThreadMain, &t);
  }
  std::vector<int> order(n);
  int live = n;
  while (live > 0) {
    for (int i = 0; i < n; ++i) order[i] = i;
    if (b.order == ThreadOrder::kReverse) std::reverse(order.begin(), order.end());
    if (b.order == ThreadOrder::kRandom) std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      EmuThread& t = b.threads[i];
      if (t.wait != Wait::kRunnable) continue;
      g_current = &t;
      t.fiber->Resume();
      g_current = nullptr;
      if (t.wait == Wait::kDone) --live;
    }
    if (live == 0) break;
    if (ReleaseWarps(b)) continue;
    if (ReleaseBarrier(b)) continue;
    Deadlock(b);
  }
}

}  // namespace

ThreadOrder ConfiguredOrder() {
  static const ThreadOrder order = [] {
    const char* env = std::getenv("SLUICE_EMU_ORDER");
    const std::string s = env == nullptr ? "mixed" : env;
    if (s == "forward") return ThreadOrder::kForward;
    if (s == "reverse") return ThreadOrder::kReverse;
    if (s == "random") return ThreadOrder::kRandom;
    if (s != "mixed") {
      std::fprintf(stderr, "sluice emu: SLUICE_EMU_ORDER=%s is not forward|reverse|random|mixed\n",
                   s.c_str());
      std::abort();
    }
    return ThreadOrder::kMixed;
  }();
  return order;
}

uint64_t ConfiguredSeed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("SLUICE_EMU_SEED");
    uint64_t s = 0;
    if (env != nullptr && absl::SimpleAtoi(env, &s)) return s;
    return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  }();
  return seed;
}

void Fault(const std::string& message) {
  std::string where;
  if (g_block != nullptr) {
    const uint3& bi = g_block->block_idx;
    absl::StrAppendFormat(&where, "\n  in kernel %s, block (%d,%d,%d)", g_block->spec->kernel, bi.x,
                          bi.y, bi.z);
    if (g_current != nullptr) absl::StrAppendFormat(&where, ", %s", Describe(*g_current));
    absl::StrAppendFormat(&where, "; thread order %s, SLUICE_EMU_SEED=%d",
                          OrderName(g_block->order), ConfiguredSeed());
  }
  std::fprintf(stderr, "sluice emu: %s%s\n", message.c_str(), where.c_str());
  std::fflush(stderr);
  std::abort();
}

void RunGrid(const GridSpec& spec) {
  std::lock_guard<std::mutex> lock(g_grid_mutex);
  const int n = static_cast<int>(spec.block.x * spec.block.y * spec.block.z);
  std::vector<std::unique_ptr<Fiber>>& pool = FiberPool();
  while (static_cast<int>(pool.size()) < n) {
    pool.push_back(std::make_unique<Fiber>(&ThreadMain, nullptr, kStackBytes));
  }
  std::mt19937_64 rng(ConfiguredSeed() + g_launches++);
  const ThreadOrder configured = ConfiguredOrder();
  BlockRun b;
  b.spec = &spec;
  b.threads.resize(n);
  g_block = &b;
  TsanRelease(&g_launch_sync);
  uint64_t block_count = 0;
  std::vector<void*> retired;
  std::vector<std::unique_ptr<char[]>> retired_syncs;
  for (unsigned bz = 0; bz < spec.grid.z; ++bz) {
    for (unsigned by = 0; by < spec.grid.y; ++by) {
      for (unsigned bx = 0; bx < spec.grid.x; ++bx) {
        b.block_idx = uint3{bx, by, bz};
        b.order = configured != ThreadOrder::kMixed
                      ? configured
                      : static_cast<ThreadOrder>(block_count % 3);  // forward, reverse, random
        ++block_count;
        b.dynamic_shared = AllocateShared(spec.dynamic_shared_bytes, 128);
        b.sync = std::make_unique<char[]>(1 + (n + kWarpSize - 1) / kWarpSize);
        for (int i = 0; i < n; ++i) {
          EmuThread& t = b.threads[i];
          t.linear = i;
          t.index.thread_idx = uint3{static_cast<unsigned>(i) % spec.block.x,
                                     static_cast<unsigned>(i) / spec.block.x % spec.block.y,
                                     static_cast<unsigned>(i) / (spec.block.x * spec.block.y)};
          t.index.block_idx = b.block_idx;
          t.index.block_dim = spec.block;
          t.index.grid_dim = spec.grid;
        }
        RunBlock(b, rng);
        // Under TSan the block's memory is freed after the grid, once its accesses are ordered
        // before the host's; a reused address would also look like one shared by two blocks.
        retired.push_back(b.dynamic_shared);
        for (SharedAllocation& s : b.statics) retired.push_back(s.data);
        retired_syncs.push_back(std::move(b.sync));
        b.dynamic_shared = nullptr;
        b.statics.clear();
        if (!TsanActive()) {
          for (void* p : retired) std::free(p);
          retired.clear();
          retired_syncs.clear();
        }
      }
    }
  }
  g_block = nullptr;
  TsanAcquire(&g_end_sync);
  for (void* p : retired) std::free(p);
}

// ---- The device API of device.h ----

const ThreadIndex& Self() { return Current("threadIdx/blockIdx").index; }

int SyncThreadsReduce(int predicate, BlockReduceOp op, const char* file, int line) {
  EmuThread& t = Current("__syncthreads");
  t.predicate = predicate;
  g_block->reduce_op = op;
  t.file = file;
  t.line = line;
  t.wait = Wait::kBarrier;
  TsanRelease(&g_block->sync[0]);
  t.fiber->Yield();
  TsanAcquire(&g_block->sync[0]);
  return t.reduce_result;
}

void SyncThreads(const char* file, int line) {
  SyncThreadsReduce(0, BlockReduceOp::kCount, file, line);
}

uint64_t WarpCollective(unsigned mask, WarpOp op, uint64_t value, int arg, int width,
                        const char* file, int line) {
  EmuThread& t = Current("a warp collective");
  t.mask = mask;
  t.op = op;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.file = file;
  t.line = line;
  t.wait = Wait::kWarp;
  char* sync = &g_block->sync[1 + t.linear / kWarpSize];
  TsanRelease(sync);
  t.fiber->Yield();
  TsanAcquire(sync);
  return t.result;
}

void MmaM16N8K16(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4], const char* file,
                 int line) {
  EmuThread& t = Current("mma.sync");
  for (int i = 0; i < 4; ++i) t.mma_ab[i] = a[i];
  t.mma_ab[4] = b[0];
  t.mma_ab[5] = b[1];
  for (int i = 0; i < 4; ++i) t.mma_cd[i] = d[i];
  WarpCollective(0xffffffffu, WarpOp::kMma, 0, 0, kWarpSize, file, line);
  for (int i = 0; i < 4; ++i) d[i] = t.mma_cd[i];
}

unsigned ActiveMask() {
  EmuThread& t = Current("__activemask");
  const int w0 = t.linear / kWarpSize * kWarpSize;
  const int lanes = std::min<int>(kWarpSize, static_cast<int>(g_block->threads.size()) - w0);
  unsigned mask = 0;
  for (int k = 0; k < lanes; ++k) {
    if (g_block->threads[w0 + k].wait != Wait::kDone) mask |= 1u << k;
  }
  return mask;
}

void* BlockSharedBytes(const void* tag, size_t bytes, size_t align) {
  Current("shared memory");
  Untracked untracked;
  for (const SharedAllocation& s : g_block->statics) {
    if (s.tag == tag) return s.data;
  }
  g_block->statics.push_back({tag, AllocateShared(bytes, align), bytes});
  return g_block->statics.back().data;
}

void* DynamicSharedBytes() {
  Current("dynamic shared memory");
  return g_block->dynamic_shared;
}

void PipelineCopy(void* dst, const void* src, size_t bytes, size_t zero_fill, const char* file,
                  int line) {
  EmuThread& t = Current("__pipeline_memcpy_async");
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    Fault(absl::StrFormat("cp.async of %d bytes at %s:%d: the size must be 4, 8 or 16", bytes, file,
                          line));
  }
  if (zero_fill > bytes) {
    Fault(absl::StrFormat("cp.async at %s:%d zero-fills %d of %d bytes", file, line, zero_fill,
                          bytes));
  }
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    Fault(absl::StrFormat("cp.async of %d bytes at %s:%d from %p to %p is not %d-byte aligned",
                          bytes, file, line, src, dst, bytes));
  }
  if (!IsShared(*g_block, dst, bytes)) {
    Fault(absl::StrFormat("cp.async at %s:%d writes %p, which is not this block's shared memory",
                          file, line, dst));
  }
  PendingCopy c{static_cast<uint8_t*>(dst), bytes, {}};
  std::memcpy(c.data, src, bytes - zero_fill);  // the thread's read of the source
  Untracked untracked;
  t.open.push_back(c);
}

void PipelineCommit() {
  EmuThread& t = Current("__pipeline_commit");
  Untracked untracked;
  t.committed.push_back(std::move(t.open));
  t.open.clear();
}

void PipelineWaitPrior(size_t groups) {
  EmuThread& t = Current("__pipeline_wait_prior");
  while (t.committed.size() > groups) {
    Land(t.committed.front());  // the thread's write of shared memory
    Untracked untracked;
    t.committed.pop_front();
  }
}

}  // namespace sluice::emu
