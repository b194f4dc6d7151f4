#include "kvstore/cache/prefix_index.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kvstore {
namespace {

std::vector<int32_t> Tokens(int n, int start = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = start + i;
  return t;
}

TEST(PrefixIndex, FindsTheLongestHeldPrefixOfWholeBlocksWithinTheLimit) {
  PrefixIndex index(4);
  const std::vector<int32_t> a = Tokens(14);
  EXPECT_EQ(index.Longest(a, 14).tokens, 0);
  EXPECT_TRUE(index.Insert(a, 4, 10));
  EXPECT_TRUE(index.Insert(a, 8, 11));
  EXPECT_TRUE(index.Insert(a, 12, 12));
  EXPECT_EQ(index.size(), 3);
  PrefixIndex::Hit hit = index.Longest(a, 13);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(hit.seq, 12);
  // A prompt must leave a token to compute: the limit cuts the hit to whole blocks below it.
  hit = index.Longest(a, 12);
  EXPECT_EQ(hit.tokens, 12);
  hit = index.Longest(a, 11);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.seq, 11);
  // A prompt that parts from `a` inside its third block shares the first two.
  std::vector<int32_t> b = a;
  b[9] = 99;
  hit = index.Longest(b, 14);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.seq, 11);
  b[0] = 99;
  EXPECT_EQ(index.Longest(b, 14).tokens, 0);
  EXPECT_TRUE(index.Holds(a, 8));
  EXPECT_FALSE(index.Holds(b, 4));
  EXPECT_FALSE(index.Holds(a, 6));  // not a whole block
  // The path: every entry from the first block, up to the limit or the first not held.
  EXPECT_EQ(index.Path(a, 14), (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(index.Path(a, 11), (std::vector<int64_t>{10, 11}));
  b = a;
  b[9] = 99;
  EXPECT_EQ(index.Path(b, 14), (std::vector<int64_t>{10, 11}));
  b[0] = 99;
  EXPECT_TRUE(index.Path(b, 14).empty());
}

TEST(PrefixIndex, InsertsOnlyBelowAHeldParentAndNeverTwice) {
  PrefixIndex index(4);
  const std::vector<int32_t> a = Tokens(12);
  EXPECT_FALSE(index.Insert(a, 8, 1));   // no entry for the first block
  EXPECT_FALSE(index.Insert(a, 6, 1));   // not whole blocks
  EXPECT_FALSE(index.Insert(a, 0, 1));   // nothing
  EXPECT_FALSE(index.Insert(a, 16, 1));  // past the tokens
  EXPECT_TRUE(index.Insert(a, 4, 1));
  EXPECT_FALSE(index.Insert(a, 4, 2));  // held already
  EXPECT_TRUE(index.Insert(a, 8, 3));
  EXPECT_EQ(index.size(), 2);
  EXPECT_EQ(index.Longest(a, 12).seq, 3);
}

TEST(PrefixIndex, EvictsTheLeastRecentlyUsedLeafFirst) {
  PrefixIndex index(2);
  const std::vector<int32_t> a = Tokens(6), b = Tokens(6, 100), c = {0, 1, 50, 51};
  ASSERT_TRUE(index.Insert(a, 2, 1));
  ASSERT_TRUE(index.Insert(a, 4, 2));
  ASSERT_TRUE(index.Insert(b, 2, 3));
  ASSERT_TRUE(index.Insert(c, 4, 4));  // a sibling of a's second block
  // b was inserted after a's entries but then a is looked up: a's path is the most recent.
  index.Longest(a, 6);
  // Leaves: a's second block (2), b (3), c's second block (4); c's was made after b but b is
  // older: b goes first, then c's, then a's second block; a's first block only once it is a
  // leaf.
  EXPECT_EQ(index.EvictLeastRecent(), 3);
  EXPECT_EQ(index.EvictLeastRecent(), 4);
  EXPECT_EQ(index.EvictLeastRecent(), 2);
  EXPECT_EQ(index.EvictLeastRecent(), 1);
  EXPECT_EQ(index.EvictLeastRecent(), std::nullopt);
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.Longest(a, 6).tokens, 0);
}

// Entries are named as PrefixBlockHashes names a prompt's prefixes; the names differ for other
// tokens, another block size, and are fixed numbers (the router and the workers are apart).
TEST(PrefixIndex, NamesItsEntriesAsPrefixBlockHashesNamesAPromptsPrefixes) {
  PrefixIndex index(4);
  const std::vector<int32_t> a = Tokens(13);
  ASSERT_TRUE(index.Insert(a, 4, 1));
  ASSERT_TRUE(index.Insert(a, 8, 2));
  std::vector<int32_t> b = a;
  b[5] = 77;
  ASSERT_TRUE(index.Insert(b, 8, 3));
  const std::vector<uint64_t> ha = PrefixBlockHashes(a, 4, 13), hb = PrefixBlockHashes(b, 4, 13);
  ASSERT_EQ(ha.size(), 3u);  // whole blocks only
  EXPECT_EQ(PrefixBlockHashes(a, 4, 12).size(), 3u);
  EXPECT_EQ(PrefixBlockHashes(a, 4, 11).size(), 2u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_NE(PrefixBlockHashes(a, 2, 13)[1], ha[0]);
  std::vector<int64_t> seqs = index.Sequences();
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 3}));
  std::vector<uint64_t> names = index.Hashes();
  std::sort(names.begin(), names.end());
  std::vector<uint64_t> expected = {ha[0], ha[1], hb[1]};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  // Fixed: the same in every process and build (SplitMix64 of 2, then of each token in turn).
  EXPECT_EQ(PrefixBlockHashes(Tokens(2), 2, 2), std::vector<uint64_t>{0x7bdc61a85e2e79ULL});
}

// Against a plain list of held prefixes on random prompts: the same longest hit, and Clear
// returns every sequence once.
TEST(PrefixIndex, AgreesWithAListOfHeldPrefixes) {
  std::mt19937 rng(std::random_device{}());
  PrefixIndex index(3);
  std::vector<std::vector<int32_t>> held;  // held[i]: the prefix of seq i
  int64_t next_seq = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> prompt(1 + rng() % 15);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 3);
    const int64_t limit = static_cast<int64_t>(rng() % (prompt.size() + 1));
    size_t best = 0;
    for (const auto& h : held) {
      if (h.size() <= static_cast<size_t>(limit) && h.size() <= prompt.size() &&
          std::equal(h.begin(), h.end(), prompt.begin())) {
        best = std::max(best, h.size());
      }
    }
    ASSERT_EQ(index.Longest(prompt, limit).tokens, static_cast<int64_t>(best));
    const int64_t length = 3 * (1 + static_cast<int64_t>(rng() % 5));
    const bool fits = length <= static_cast<int64_t>(prompt.size());
    const bool parent_held = fits && (length == 3 || index.Holds(prompt, length - 3));
    const bool was_held = index.Holds(prompt, length);
    const bool inserted = index.Insert(prompt, length, next_seq);
    EXPECT_EQ(inserted, parent_held && !was_held);
    held.resize(next_seq + 1);
    if (inserted) held[next_seq].assign(prompt.begin(), prompt.begin() + length);
    ++next_seq;
  }
  std::vector<int64_t> seqs = index.Clear();
  int64_t expected = 0;
  for (const auto& h : held) expected += h.empty() ? 0 : 1;
  EXPECT_EQ(static_cast<int64_t>(seqs.size()), expected);
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(std::unique(seqs.begin(), seqs.end()), seqs.end());
  for (int64_t s : seqs) EXPECT_FALSE(held[s].empty());
  EXPECT_EQ(index.size(), 0);
}

}  // namespace
}  // namespace sluice::kvstore
