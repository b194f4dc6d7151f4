// Where the router finds its workers: sources resolved (an address, a DNS name, a file of
// either), and a registry that adds the workers its sources come to name and removes the ones
// they stop naming, keeping what a source named last when it cannot be read.
#include "router/worker_registry.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvstore/cache/prefix_index.h"

namespace sluice::router {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR")) + "/" + name;
}

void WriteLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path + ".new");
  for (const std::string& l : lines) out << l << "\n";
  out.close();
  std::rename((path + ".new").c_str(), path.c_str());  // atomically, as a ConfigMap update
}

TEST(WorkerRegistry, ResolvesAddressesNamesAndFiles) {
  EXPECT_EQ(*WorkerRegistry::Resolve("10.0.0.7:50200"), std::vector<std::string>{"10.0.0.7:50200"});
  auto local = WorkerRegistry::Resolve("dns:localhost:50200");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(std::count(local->begin(), local->end(), "127.0.0.1:50200") == 1 ||
              std::count(local->begin(), local->end(), "[::1]:50200") == 1);
  auto unknown = WorkerRegistry::Resolve("dns:no-such-host.invalid:1");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(unknown.status().message().find("no-such-host.invalid"), std::string::npos);
  EXPECT_EQ(WorkerRegistry::Resolve("dns:noport").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string list = TempPath("list");
  WriteLines(list, {"# decode workers", "10.0.0.8:1", "", "dns:localhost:2  # by name"});
  auto listed = WorkerRegistry::Resolve("file:" + list);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_GE(listed->size(), 2u);
  EXPECT_EQ((*listed)[0], "10.0.0.8:1");
  EXPECT_EQ(WorkerRegistry::Resolve("file:/no/such/list").status().code(),
            absl::StatusCode::kNotFound);
}

std::set<std::string> Decoders(WorkerRegistry& r) {
  std::set<std::string> out;
  for (const auto& v : r.Snapshot()) {
    if (v.role == "decode") out.insert(v.address);
  }
  return out;
}

// Polls until the registry's decode workers are `want` (5 s at most).
bool Becomes(WorkerRegistry& r, const std::set<std::string>& want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Decoders(r) != want && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return Decoders(r) == want;
}

TEST(WorkerRegistry, FollowsItsSources) {
  // Nothing listens on these ports: the workers are down, but named and pickable.
  const std::string list = TempPath("decode");
  WriteLines(list, {"127.0.0.1:9"});
  WorkerRegistry r({"127.0.0.1:7"}, {"file:" + list}, Placement::kRoundRobin,
                   absl::Milliseconds(20));
  EXPECT_EQ(Decoders(r), (std::set<std::string>{"127.0.0.1:9"}));  // the first poll named it
  WriteLines(list, {"127.0.0.1:9", "127.0.0.1:11", "127.0.0.1:13"});
  EXPECT_TRUE(Becomes(r, {"127.0.0.1:9", "127.0.0.1:11", "127.0.0.1:13"}));
  Worker* added = nullptr;
  std::set<Worker*> picked;
  for (int i = 0; i < 3; ++i) picked.insert(r.Pick("decode", {}, {}));
  EXPECT_EQ(picked.size(), 3u);  // round robin over all three
  for (Worker* w : picked) {
    if (w->address == "127.0.0.1:13") added = w;
  }
  ASSERT_NE(added, nullptr);

  WriteLines(list, {"127.0.0.1:11"});
  EXPECT_TRUE(Becomes(r, {"127.0.0.1:11"}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.Pick("decode", {}, {})->address, "127.0.0.1:11");
  EXPECT_EQ(added->address, "127.0.0.1:13");  // a removed worker stays valid for its requests

  std::remove(list.c_str());  // unreadable: keep what it named last
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(Decoders(r), (std::set<std::string>{"127.0.0.1:11"}));
  WriteLines(list, {"127.0.0.1:13"});  // named again: the same worker comes back
  EXPECT_TRUE(Becomes(r, {"127.0.0.1:13"}));
  EXPECT_EQ(r.Pick("decode", {}, {}), added);
}

// prefix_affinity: the worker that would compute the fewest prompt tokens, its queue and the
// prompt past its longest cached prefix; a placed prompt's prefixes count as cached there.
TEST(PickByPrefix, WeighsCachedPrefixesAgainstQueuedTokens) {
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 1000);
  Worker a, b;
  a.address = "a";
  b.address = "b";
  for (Worker* w : {&a, &b}) w->stats.set_prefix_block_tokens(64);
  const std::vector<uint64_t> names = kvstore::PrefixBlockHashes(prompt, 64, 300);
  ASSERT_EQ(names.size(), 4u);
  // b holds the first 128 tokens: 172 to compute there against 300 on a.
  b.prefixes.insert(names.begin(), names.begin() + 2);
  std::vector<Worker*> live = {&a, &b};
  EXPECT_EQ(PickByPrefix(live, prompt), &b);
  // Placed on b, the prompt's whole blocks count as cached there until b's next poll.
  for (uint64_t name : names) EXPECT_TRUE(b.prefixes.contains(name));
  b.prefixes = {names[0], names[1]};  // the poll
  // b's queue outweighs its cache: a computes 300 against 172 + 200.
  b.stats.set_queued_prompt_tokens(200);
  EXPECT_EQ(PickByPrefix(live, prompt), &a);
  // Now placed on a, its whole blocks count as cached there: 100 + 44 on a against 372.
  for (uint64_t name : names) EXPECT_TRUE(a.prefixes.contains(name));
  a.stats.set_queued_prompt_tokens(100);
  EXPECT_EQ(PickByPrefix(live, prompt), &a);
  // Only the prefix's blocks count: another prompt of the same first block but then other
  // tokens finds 64 cached on both.
  std::vector<int32_t> other = prompt;
  other[70] = 999;
  b.stats.set_queued_prompt_tokens(0);
  EXPECT_EQ(PickByPrefix(live, other), &b);  // 100 + 236 on a against 0 + 236 on b
}

// A prefix cached nowhere, workers alike: the prompt's first tokens pick, the same each time.
TEST(PickByPrefix, TiesGoByThePromptsFirstTokens) {
  std::vector<Worker> workers(4);
  std::vector<Worker*> live;
  for (Worker& w : workers) live.push_back(&w);
  std::set<Worker*> picked;
  for (int32_t first = 0; first < 40; ++first) {
    std::vector<int32_t> prompt = {first, 5, 6, 7};
    Worker* w = PickByPrefix(live, prompt);
    EXPECT_EQ(PickByPrefix(live, prompt), w);  // block size 0: nothing is recorded as cached
    picked.insert(w);
  }
  EXPECT_EQ(picked.size(), 4u);
}

// prefix_affinity on decode workers: the one holding the longest prefix of the prompt, while
// it is not much busier than the least busy nor short of pages; else the most free pages.
TEST(PickByHeldPrefix, PrefersTheLongestHeldPrefixWithinLoadAndPages) {
  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 11 % 1000);
  Worker a, b, c;
  for (Worker* w : {&a, &b, &c}) {
    w->stats.set_prefix_block_tokens(64);
    w->stats.set_kv_pages_free(1000);
  }
  a.stats.set_kv_pages_free(1200);  // the most free pages
  const std::vector<uint64_t> names = kvstore::PrefixBlockHashes(prompt, 64, 300);
  std::vector<Worker*> live = {&a, &b, &c};
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &a);  // nothing held anywhere
  b.prefixes.insert(names.begin(), names.begin() + 1);
  c.prefixes.insert(names.begin(), names.begin() + 3);
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &c);  // 192 tokens held against 64
  // The whole prompt may be held: a decode worker holds pages, not a token to compute.
  c.prefixes.insert(names.begin(), names.end());
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &c);
  c.stats.set_running(9);  // more than 8 sequences busier than the least busy
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &b);
  b.stats.set_kv_pages_free(500);  // short of pages: under half the most free
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &a);
  c.stats.set_running(0);
  EXPECT_EQ(PickByHeldPrefix(live, prompt), &c);
  // Another prompt that shares only the first block.
  std::vector<int32_t> other = prompt;
  other[70] = 999;
  b.stats.set_kv_pages_free(1000);
  EXPECT_EQ(PickByHeldPrefix(live, other), &b);  // the first of the workers holding 64
}

}  // namespace
}  // namespace sluice::router
