// Transport tests: every backend (loopback, UCX over its default, TCP and shared memory) puts
// random bytes at ragged offsets and the region must hold exactly them afterwards; bad puts and
// malformed descriptors are rejected. UCX also runs across two processes (fork): a child
// exposes a buffer and checks what the parent wrote, and a child killed mid-stream must make
// the parent's Put/Flush fail promptly instead of hanging.
#include "transport/transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace sluice::transport {
namespace {

constexpr absl::Duration kFlushTimeout = absl::Seconds(5);

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

struct Backend {
  std::string name;
  bool ucx;
  std::string tls;  // UCX_TLS for UCX backends
};

std::unique_ptr<Transport> Make(const Backend& b) {
  if (!b.ucx) return CreateLoopbackTransport();
  absl::StatusOr<std::unique_ptr<Transport>> t = CreateUcxTransport({.transports = b.tls});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

class TransportTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    receiver_ = Make(GetParam());
    sender_ = Make(GetParam());
    ASSERT_NE(receiver_, nullptr);
    ASSERT_NE(sender_, nullptr);
  }

  // Separate transports for the two sides, as in two workers.
  std::unique_ptr<Transport> receiver_;
  std::unique_ptr<Transport> sender_;
};

// The receiver's memory: the test's own (Expose) or the transport's (AllocateAndExpose).
enum class Memory { kOwn, kAllocated };

struct Exposed {
  std::vector<uint8_t> own;  // empty for kAllocated
  std::unique_ptr<ExposedRegion> region;
  uint8_t* data() const { return static_cast<uint8_t*>(region->base()); }
};

// Exposes `bytes` bytes holding `initial`.
Exposed ExposeBytes(Transport& t, Memory memory, const std::vector<uint8_t>& initial) {
  Exposed e;
  if (memory == Memory::kOwn) {
    e.own = initial;
    auto r = t.Expose(e.own.data(), e.own.size());
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) e.region = *std::move(r);
  } else {
    auto r = t.AllocateAndExpose(initial.size());
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      e.region = *std::move(r);
      std::memcpy(e.data(), initial.data(), initial.size());
    }
  }
  return e;
}

TEST_P(TransportTest, PutsLandAtTheirOffsetsAndNothingElseChanges) {
  constexpr size_t kRegion = 14 << 20;
  struct Case {
    size_t bytes;
    uint64_t offset;
  };
  // Disjoint: puts between two flushes may land in any order.
  const std::vector<Case> cases = {
      {1, 0},
      {4096, 4096},
      {4096, 12345},
      {777, 100003},
      {65536, 1 << 20},
      {65536, (2 << 20) + 3},
      {65536 + 5, (2 << 20) + (256 << 10) + 1},
      {(2 << 20) - 1, 3 << 20},
      {4 << 20, 5 << 20},
      {1, (9 << 20) + 5},
      {4 << 20, kRegion - (4 << 20)},  // ends at the region's end
  };
  for (const Memory memory : {Memory::kOwn, Memory::kAllocated}) {
    SCOPED_TRACE(memory == Memory::kOwn ? "Expose" : "AllocateAndExpose");
    std::vector<uint8_t> want = RandomBytes(kRegion, 1);
    const Exposed exposed = ExposeBytes(*receiver_, memory, want);
    ASSERT_NE(exposed.region, nullptr);
    ASSERT_EQ(exposed.region->size(), kRegion);
    if (memory == Memory::kAllocated) {
      ASSERT_EQ(reinterpret_cast<uintptr_t>(exposed.data()) % 64, 0u);
    }
    auto sender = sender_->Connect(exposed.region->descriptor());
    ASSERT_TRUE(sender.ok()) << sender.status();

    std::vector<std::vector<uint8_t>> sources;  // must stay unchanged until Flush
    uint64_t total = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      sources.push_back(RandomBytes(cases[i].bytes, 100 + i));
      std::memcpy(want.data() + cases[i].offset, sources.back().data(), cases[i].bytes);
      ASSERT_TRUE((*sender)->Put(sources.back().data(), cases[i].bytes, cases[i].offset).ok());
      total += cases[i].bytes;
    }
    ASSERT_TRUE((*sender)->Flush(kFlushTimeout).ok());
    EXPECT_EQ((*sender)->bytes_put(), total);
    // Compare in chunks so a failure names where, not 14 MiB of bytes.
    for (size_t at = 0; at < kRegion; at += 4096) {
      const size_t n = std::min<size_t>(4096, kRegion - at);
      ASSERT_EQ(std::memcmp(exposed.data() + at, want.data() + at, n), 0)
          << "first bad chunk at " << at;
    }
  }
}

// A receiver exposing a region per reservation: senders to one peer's regions come and go
// (sharing the connection to it, for UCX) and each put lands in its own region only.
TEST_P(TransportTest, RegionsOfOnePeerComeAndGo) {
  constexpr size_t kRegion = 256 << 10;
  std::vector<uint8_t> zeros(kRegion, 0);
  Exposed a = ExposeBytes(*receiver_, Memory::kAllocated, zeros);
  ASSERT_NE(a.region, nullptr);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    Exposed b = ExposeBytes(*receiver_, Memory::kAllocated, zeros);
    ASSERT_NE(b.region, nullptr);
    auto to_a = sender_->Connect(a.region->descriptor());
    auto to_b = sender_->Connect(b.region->descriptor());
    ASSERT_TRUE(to_a.ok()) << to_a.status();
    ASSERT_TRUE(to_b.ok()) << to_b.status();
    const std::vector<uint8_t> pa = RandomBytes(4096, 2 * round),
                               pb = RandomBytes(4096, 2 * round + 1);
    ASSERT_TRUE((*to_a)->Put(pa.data(), pa.size(), 8192).ok());
    ASSERT_TRUE((*to_b)->Put(pb.data(), pb.size(), 8192).ok());
    to_a->reset();  // the other sender to the same peer goes on
    ASSERT_TRUE((*to_b)->Flush(absl::Seconds(10)).ok());
    EXPECT_EQ(std::memcmp(b.data() + 8192, pb.data(), pb.size()), 0);
    EXPECT_TRUE(std::all_of(b.data(), b.data() + 8192, [](uint8_t v) { return v == 0; }));
    // a's put was flushed with b's (one connection) or before its sender went.
    auto again = sender_->Connect(a.region->descriptor());
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE((*again)->Flush(absl::Seconds(10)).ok());
    EXPECT_EQ(std::memcmp(a.data() + 8192, pa.data(), pa.size()), 0);
  }
}

TEST_P(TransportTest, PutFromRegisteredSource) {
  std::vector<uint8_t> region(1 << 20, 0);
  std::vector<uint8_t> arena = RandomBytes(4 << 20, 7);
  ASSERT_TRUE(sender_->RegisterSource(arena.data(), arena.size()).ok());
  auto exposed = receiver_->Expose(region.data(), region.size());
  ASSERT_TRUE(exposed.ok()) << exposed.status();
  auto sender = sender_->Connect((*exposed)->descriptor());
  ASSERT_TRUE(sender.ok()) << sender.status();
  // Pages out of the middle of the registered arena, and one straddling nothing registered.
  ASSERT_TRUE((*sender)->Put(arena.data() + 65536, 65536, 0).ok());
  ASSERT_TRUE((*sender)->Put(arena.data() + (3 << 20), 1 << 19, 65536).ok());
  std::vector<uint8_t> unregistered = RandomBytes(4096, 8);
  ASSERT_TRUE((*sender)->Put(unregistered.data(), 4096, (1 << 20) - 4096).ok());
  ASSERT_TRUE((*sender)->Flush(kFlushTimeout).ok());
  EXPECT_EQ(std::memcmp(region.data(), arena.data() + 65536, 65536), 0);
  EXPECT_EQ(std::memcmp(region.data() + 65536, arena.data() + (3 << 20), 1 << 19), 0);
  EXPECT_EQ(std::memcmp(region.data() + (1 << 20) - 4096, unregistered.data(), 4096), 0);
}

TEST_P(TransportTest, OutOfRangePutIsInvalidArgument) {
  std::vector<uint8_t> region(65536, 0);
  auto exposed = receiver_->Expose(region.data(), region.size());
  ASSERT_TRUE(exposed.ok()) << exposed.status();
  auto sender = sender_->Connect((*exposed)->descriptor());
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<uint8_t> src(65537, 1);
  EXPECT_TRUE(absl::IsInvalidArgument((*sender)->Put(src.data(), 2, 65535)));
  EXPECT_TRUE(absl::IsInvalidArgument((*sender)->Put(src.data(), 1, 65536)));
  EXPECT_TRUE(absl::IsInvalidArgument((*sender)->Put(src.data(), 65537, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (*sender)->Put(src.data(), 16, std::numeric_limits<uint64_t>::max() - 8)));
  EXPECT_TRUE(
      absl::IsInvalidArgument((*sender)->Put(src.data(), std::numeric_limits<size_t>::max(), 1)));
  const absl::Status st = (*sender)->Put(src.data(), 2, 65535);
  EXPECT_NE(st.message().find("65535"), std::string::npos) << st;
  ASSERT_TRUE((*sender)->Flush(kFlushTimeout).ok());
  EXPECT_EQ((*sender)->bytes_put(), 0u);
  EXPECT_EQ(region, std::vector<uint8_t>(65536, 0));  // nothing was written
  // The edges themselves are fine.
  EXPECT_TRUE((*sender)->Put(src.data(), 65536, 0).ok());
  EXPECT_TRUE((*sender)->Put(src.data(), 1, 65535).ok());
  EXPECT_TRUE((*sender)->Flush(kFlushTimeout).ok());
}

TEST_P(TransportTest, ExposeRejectsEmptyMemory) {
  uint8_t byte = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->Expose(nullptr, 4096).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(receiver_->Expose(&byte, 0).status()));
}

TEST_P(TransportTest, MalformedDescriptorsAreInvalidArgument) {
  std::vector<uint8_t> region(4096, 0);
  auto exposed = receiver_->Expose(region.data(), region.size());
  ASSERT_TRUE(exposed.ok()) << exposed.status();
  const std::string good = (*exposed)->descriptor();
  std::vector<std::string> bad = {
      "",
      good.substr(0, good.size() - 1),
      good.substr(0, good.size() / 2),
      good.substr(0, 1),
      good + "x",
      "garbage",
      std::string(64, '\0'),
      std::string(4096, '\xff'),
  };
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<uint8_t> r = RandomBytes(1 + seed * 37, seed);
    bad.emplace_back(r.begin(), r.end());
  }
  // One flipped bit anywhere in a good descriptor.
  for (size_t i = 0; i < good.size(); i += std::max<size_t>(1, good.size() / 16)) {
    std::string flipped = good;
    flipped[i] ^= 0x10;
    bad.push_back(flipped);
  }
  for (const std::string& d : bad) {
    const auto sender = sender_->Connect(d);
    // A loopback descriptor cut short may still be well formed ("loopback:12" -> "loopback:1"),
    // naming a region that is not exposed.
    const bool named_another =
        !GetParam().ucx && absl::IsNotFound(sender.status()) && good.substr(0, d.size()) == d;
    EXPECT_TRUE(absl::IsInvalidArgument(sender.status()) || named_another)
        << "descriptor of " << d.size() << " bytes: " << sender.status();
  }
  // The good one still works after all that.
  EXPECT_TRUE(sender_->Connect(good).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest,
                         ::testing::Values(Backend{"loopback", false, ""},
                                           Backend{"ucx_default", true, ""},
                                           Backend{"ucx_tcp", true, "tcp"},
                                           Backend{"ucx_shm", true, "shm"}),
                         [](const auto& info) { return info.param.name; });

// ---- loopback specifics ----

TEST(LoopbackTest, ConnectToUnknownOrDestroyedRegionIsNotFound) {
  auto t = CreateLoopbackTransport();
  EXPECT_TRUE(absl::IsNotFound(t->Connect("loopback:999999999").status()));
  std::vector<uint8_t> region(64);
  std::string descriptor;
  {
    auto exposed = t->Expose(region.data(), region.size());
    ASSERT_TRUE(exposed.ok());
    descriptor = (*exposed)->descriptor();
  }
  const auto sender = t->Connect(descriptor);
  EXPECT_TRUE(absl::IsNotFound(sender.status())) << sender.status();
  EXPECT_NE(sender.status().message().find(descriptor.substr(9)), std::string::npos);
}

TEST(LoopbackTest, PutAfterRegionDestroyedIsUnavailable) {
  auto t = CreateLoopbackTransport();
  std::vector<uint8_t> region(64);
  auto exposed = t->Expose(region.data(), region.size());
  ASSERT_TRUE(exposed.ok());
  auto sender = t->Connect((*exposed)->descriptor());
  ASSERT_TRUE(sender.ok());
  exposed->reset();
  const uint8_t byte = 1;
  EXPECT_TRUE(absl::IsUnavailable((*sender)->Put(&byte, 1, 0)));
  EXPECT_TRUE(absl::IsUnavailable((*sender)->Flush(kFlushTimeout)));
}

// ---- UCX across two processes ----

struct TwoProcessCase {
  std::string tls;
  Memory memory;
};

// A child process that exposes a zeroed buffer through UCX and reports its descriptor.
class ExposingChild {
 public:
  // `check` runs in the child after the parent says "done"; its result is the exit code.
  ExposingChild(const TwoProcessCase& c, size_t bytes,
                std::function<int(const uint8_t*, size_t)> check) {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) != 0 || pipe(to_child) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(to_parent[0]);
      close(to_child[1]);
      alarm(30);  // never outlive a wedged parent
      _exit(RunChild(c, bytes, check, to_parent[1], to_child[0]));
    }
    close(to_parent[1]);
    close(to_child[0]);
    to_child_ = to_child[1];
    uint32_t n = 0;
    if (ReadAll(to_parent[0], &n, sizeof(n)) && n > 0 && n < (1u << 20)) {
      descriptor_.resize(n);
      if (!ReadAll(to_parent[0], descriptor_.data(), n)) descriptor_.clear();
    }
    close(to_parent[0]);
  }

  ~ExposingChild() {
    if (pid_ > 0) Kill();
    if (to_child_ >= 0) close(to_child_);
  }

  const std::string& descriptor() const { return descriptor_; }

  // Tells the child the parent is done; returns its exit code (-signal when killed).
  int Finish() {
    const char done = 'd';
    if (write(to_child_, &done, 1) != 1) return -1000;
    return Wait();
  }

  int Kill() {
    kill(pid_, SIGKILL);
    return Wait();
  }

  int Signal(int signal) { return kill(pid_, signal); }

 private:
  int Wait() {
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1001;
    pid_ = -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? -WTERMSIG(status) : -1002;
  }

  static bool ReadAll(int fd, void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = read(fd, c, n);
      if (r <= 0) return false;
      c += r;
      n -= r;
    }
    return true;
  }

  static int RunChild(const TwoProcessCase& c, size_t bytes,
                      const std::function<int(const uint8_t*, size_t)>& check, int out, int in) {
    auto t = CreateUcxTransport({.transports = c.tls});
    if (!t.ok()) return 10;
    const Exposed exposed = ExposeBytes(**t, c.memory, std::vector<uint8_t>(bytes, 0));
    if (exposed.region == nullptr) return 11;
    const std::string& d = exposed.region->descriptor();
    const uint32_t n = d.size();
    if (write(out, &n, sizeof(n)) != sizeof(n) || write(out, d.data(), n) != n) return 12;
    char done;
    if (read(in, &done, 1) != 1) return 13;  // the parent writes, or dies
    return check(exposed.data(), bytes);
  }

  pid_t pid_ = -1;
  int to_child_ = -1;
  std::string descriptor_;
};

class TwoProcessTest : public ::testing::TestWithParam<TwoProcessCase> {};

TEST_P(TwoProcessTest, ChildSeesWhatParentPut) {
  constexpr size_t kRegion = 16 << 20;
  const std::vector<size_t> sizes = {1, 4096, 65536, 4 << 20, 65536 + 3, 4 << 20};
  // Both sides derive the expected bytes from the same seeds.
  auto expected = [&] {
    std::vector<uint8_t> want(kRegion, 0);
    uint64_t offset = 5;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<uint8_t> b = RandomBytes(sizes[i], 50 + i);
      std::memcpy(want.data() + offset, b.data(), b.size());
      offset += sizes[i] + 4093;
    }
    return want;
  };
  ExposingChild child(GetParam(), kRegion, [&](const uint8_t* region, size_t bytes) {
    return std::memcmp(region, expected().data(), bytes) == 0 ? 0 : 1;
  });
  ASSERT_FALSE(child.descriptor().empty()) << "the child did not report a descriptor";

  auto t = CreateUcxTransport({.transports = GetParam().tls});
  ASSERT_TRUE(t.ok()) << t.status();
  auto sender = (*t)->Connect(child.descriptor());
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<std::vector<uint8_t>> sources;
  uint64_t offset = 5;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sources.push_back(RandomBytes(sizes[i], 50 + i));
    ASSERT_TRUE((*sender)->Put(sources.back().data(), sizes[i], offset).ok());
    offset += sizes[i] + 4093;
  }
  const absl::Status flushed = (*sender)->Flush(kFlushTimeout);
  ASSERT_TRUE(flushed.ok()) << flushed;
  EXPECT_EQ(child.Finish(), 0) << "the child's region differs from what was put";
}

TEST_P(TwoProcessTest, PeerKilledMidStreamFailsPromptly) {
  constexpr size_t kRegion = 4 << 20;
  ExposingChild child(GetParam(), kRegion, [](const uint8_t*, size_t) { return 0; });
  ASSERT_FALSE(child.descriptor().empty()) << "the child did not report a descriptor";
  auto t = CreateUcxTransport({.transports = GetParam().tls});
  ASSERT_TRUE(t.ok()) << t.status();
  auto sender = (*t)->Connect(child.descriptor());
  ASSERT_TRUE(sender.ok()) << sender.status();
  const std::vector<uint8_t> page = RandomBytes(65536, 3);
  ASSERT_TRUE((*sender)->Put(page.data(), page.size(), 0).ok());
  ASSERT_TRUE((*sender)->Flush(kFlushTimeout).ok());

  EXPECT_EQ(child.Kill(), -SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  absl::Status st;
  for (int i = 0; st.ok() && i < 1000; ++i) {
    st = (*sender)->Put(page.data(), page.size(), (i % 64) * page.size());
    if (st.ok() && i % 16 == 15) st = (*sender)->Flush(absl::Seconds(2));
  }
  EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) << st;
  // Destroying the sender closes its endpoint to the dead peer; that must not hang either.
  sender->reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
}

TEST_P(TwoProcessTest, ConnectToDeadPeerIsUnavailable) {
  ExposingChild child(GetParam(), 4096, [](const uint8_t*, size_t) { return 0; });
  ASSERT_FALSE(child.descriptor().empty()) << "the child did not report a descriptor";
  EXPECT_EQ(child.Kill(), -SIGKILL);
  auto t = CreateUcxTransport({.transports = GetParam().tls});
  ASSERT_TRUE(t.ok()) << t.status();
  const auto start = std::chrono::steady_clock::now();
  auto sender = (*t)->Connect(child.descriptor());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(absl::IsUnavailable(sender.status())) << sender.status();
  EXPECT_LT(seconds, 6.0);
}

TEST_P(TwoProcessTest, FlushTimesOutWhilePeerIsStopped) {
  if (GetParam().tls == "shm" && GetParam().memory == Memory::kAllocated) {
    GTEST_SKIP() << "puts into UCX-allocated shared memory are the sender's memcpy; a stopped "
                    "receiver cannot hold them up";
  }
  ExposingChild child(GetParam(), 4 << 20, [](const uint8_t*, size_t) { return 0; });
  ASSERT_FALSE(child.descriptor().empty()) << "the child did not report a descriptor";
  auto t = CreateUcxTransport({.transports = GetParam().tls});
  ASSERT_TRUE(t.ok()) << t.status();
  auto sender = (*t)->Connect(child.descriptor());
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_EQ(child.Signal(SIGSTOP), 0);
  const std::vector<uint8_t> bytes = RandomBytes(4 << 20, 4);
  ASSERT_TRUE((*sender)->Put(bytes.data(), bytes.size(), 0).ok());
  const auto start = std::chrono::steady_clock::now();
  const absl::Status st = (*sender)->Flush(absl::Milliseconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_GE(seconds, 0.25);
  EXPECT_LT(seconds, 2.0);
  // Once the peer runs again the same data gets through.
  ASSERT_EQ(child.Signal(SIGCONT), 0);
  const absl::Status again = (*sender)->Flush(kFlushTimeout);
  EXPECT_TRUE(again.ok()) << again;
}

TEST_P(TwoProcessTest, NoCommonTransportIsUnavailable) {
  // The child offers only the other transport.
  TwoProcessCase other = GetParam();
  other.tls = GetParam().tls == "tcp" ? "shm" : "tcp";
  ExposingChild child(other, 4096, [](const uint8_t*, size_t) { return 0; });
  ASSERT_FALSE(child.descriptor().empty()) << "the child did not report a descriptor";
  auto t = CreateUcxTransport({.transports = GetParam().tls});
  ASSERT_TRUE(t.ok()) << t.status();
  const auto sender = (*t)->Connect(child.descriptor());
  EXPECT_TRUE(absl::IsUnavailable(sender.status())) << sender.status();
}

INSTANTIATE_TEST_SUITE_P(Ucx, TwoProcessTest,
                         ::testing::Values(TwoProcessCase{"tcp", Memory::kOwn},
                                           TwoProcessCase{"tcp", Memory::kAllocated},
                                           TwoProcessCase{"shm", Memory::kOwn},
                                           TwoProcessCase{"shm", Memory::kAllocated}),
                         [](const auto& info) {
                           return info.param.tls +
                                  (info.param.memory == Memory::kOwn ? "_own" : "_allocated");
                         });

}  // namespace
}  // namespace sluice::transport
