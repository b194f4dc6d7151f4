#include "common/process.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(IdleTrimmerTest, TrimsOnceEachTimeABusyProcessTurnsIdle) {
  std::atomic<bool> idle{true};
  IdleTrimmer trimmer([&] { return idle.load(); }, absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(trimmer.trims(), 0);  // never busy: nothing to give back
  for (int round = 1; round <= 2; ++round) {
    idle = false;
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_EQ(trimmer.trims(), round - 1);
    idle = true;
    for (int i = 0; i < 200 && trimmer.trims() < round; ++i) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(30));  // idle on: no second trim
    EXPECT_EQ(trimmer.trims(), round);
  }
}

TEST(ResidentBytesTest, CountsThePagesTouched) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), pages = 64;
  void* m = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* b = static_cast<unsigned char*>(m);
  EXPECT_EQ(ResidentBytes(b, pages * page), 0);
  for (size_t i = 0; i < pages; i += 4) b[i * page + 7] = 1;  // every fourth page
  EXPECT_EQ(ResidentBytes(b, pages * page), static_cast<int64_t>(pages / 4 * page));
  // A range that starts and ends inside pages counts the pages it touches.
  EXPECT_EQ(ResidentBytes(b + 3, page), static_cast<int64_t>(page));
  EXPECT_EQ(ResidentBytes(b + page + 1, 2 * page), 0);
  EXPECT_EQ(ResidentBytes(nullptr, page), 0);
  munmap(m, pages * page);
  // Memory this process does not map.
  EXPECT_EQ(ResidentBytes(b, pages * page), 0);
}

TEST(ServedModelNameTest, IsTheFileNameWithoutItsExtension) {
  EXPECT_EQ(ServedModelName("/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            "SmolLM2-135M-Instruct.Q4_1");
}

// Mapped blocks malloc holds now.
size_t MappedBlocks() { return mallinfo2().hblks; }

void* Touch(size_t bytes) {
  auto* p = static_cast<unsigned char*>(malloc(bytes));
  for (size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  return p;
}

TEST(ServerMainTest, MapsEveryBlockOfAMebibyteOrMoreOnItsOwn) {
  char program[] = "process_test";
  char* argv[] = {program, nullptr};
  std::vector<bool> mapped;
  EXPECT_EQ(ServerMain(1, argv, "process_test",
                       [&] {
                         // Unfixed, glibc would raise its threshold to 8 MiB when the first block
                         // is freed and cut the second from the heap.
                         for (size_t bytes : {size_t{8} << 20, size_t{3} << 20, size_t{1} << 20}) {
                           const size_t before = MappedBlocks();
                           void* p = Touch(bytes);
                           mapped.push_back(MappedBlocks() == before + 1);
                           free(p);
                         }
                         return absl::OkStatus();
                       }),
            0);
  EXPECT_EQ(mapped, std::vector<bool>({true, true, true}));
}

// Arenas malloc has made so far (malloc_info lists each as a <heap>).
int Arenas() {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  malloc_info(0, f);
  fclose(f);
  int n = 0;
  for (size_t at = 0;
       (at = std::string_view(text, size).find("<heap nr=", at)) != std::string::npos; ++at) {
    ++n;
  }
  free(text);
  return n;
}

// Arenas after eight threads allocated at once in a server started with `flag`.
int ArenasAfterThreads(const char* flag) {
  char program[] = "process_test";
  std::string f = flag;
  char* argv[] = {program, f.data(), nullptr};
  int arenas = 0;
  ServerMain(2, argv, "process_test", [&] {
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        ++started;
        while (started.load() < 8) std::this_thread::yield();
        for (int i = 0; i < 1000; ++i) {
          void* volatile p = malloc(64 + i);  // volatile: not elided
          free(p);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    arenas = Arenas();
    return absl::OkStatus();
  });
  return arenas;
}

// In a fresh process (arenas outlive their threads): unbounded, glibc gave such threads 1 or 2
// arenas beside the main one in every run on this machine.
TEST(ServerMainDeathTest, BoundsMallocsArenas) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit(ArenasAfterThreads("--malloc_arenas=1")), testing::ExitedWithCode(1), "");
}

// Last (a suite of its own): it leaves a free chunk of 32 MiB in the heap, where ServerMainTest
// would find its blocks rather than map them.
TEST(IdleTrimmerFreedMemoryTest, IsTrimmedWhileIdle) {
  std::atomic<bool> idle{true};
  IdleTrimmer trimmer([&] { return idle.load(); }, absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(trimmer.trims(), 0);
  // 32 MiB of heap blocks below a block that stays: freed, they cannot shrink the heap's top
  // and stay free in the arena, as a cache dropped between requests leaves its memory.
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 512; ++i) {
    blocks.emplace_back(new char[64 << 10]);
    blocks.back()[i] = 1;
  }
  auto stays = std::make_unique<char[]>(64);
  blocks.clear();
  for (int i = 0; i < 200 && trimmer.trims() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(30));  // freed once: trimmed once
  EXPECT_EQ(trimmer.trims(), 1);
  stays[0] = 1;
}

// 32 MiB of heap blocks, every page written, below a block that stays; then freed.
std::unique_ptr<char[]> TouchAndFreeBelowOneThatStays() {
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 512; ++i) {
    blocks.emplace_back(new char[64 << 10]);
    memset(blocks.back().get(), i, 64 << 10);
  }
  auto stays = std::make_unique<char[]>(64);
  blocks.clear();
  return stays;
}

// Free chunks taken again and freed between two looks (a burst shorter than the period) leave
// the arena's free bytes as they were, its pages resident: the RSS tells.
TEST(IdleTrimmerFreedMemoryTest, TrimsWhatABurstBetweenTwoLooksTouched) {
  std::atomic<bool> hold{false}, held{false};
  IdleTrimmer trimmer(
      [&] {
        held = hold.load();
        while (hold) absl::SleepFor(absl::Milliseconds(1));  // a look that waits for the burst
        return true;
      },
      absl::Milliseconds(5));
  auto stays = TouchAndFreeBelowOneThatStays();
  // Trimmed (maybe also while the blocks were written, the RSS growing), then no more.
  for (int i = 0; i < 200 && trimmer.trims() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
  int trims = trimmer.trims();
  ASSERT_GE(trims, 1);
  for (absl::SleepFor(absl::Milliseconds(30)); trimmer.trims() != trims;
       absl::SleepFor(absl::Milliseconds(30))) {
    trims = trimmer.trims();
  }
  hold = true;
  while (!held) absl::SleepFor(absl::Milliseconds(1));
  // The look has read the free bytes and the RSS: the burst falls between it and the next.
  stays.reset();
  stays = TouchAndFreeBelowOneThatStays();
  hold = false;
  for (int i = 0; i < 200 && trimmer.trims() == trims; ++i) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(30));  // touched once: trimmed once
  EXPECT_EQ(trimmer.trims(), trims + 1);
  stays[0] = 1;
}

}  // namespace
}  // namespace sluice
