// Which prompt prefixes a cache holds, as a radix tree over fixed blocks of tokens (SGLang's
// RadixAttention tree, vLLM's block hashes): entry k of a path holds the first k blocks of a
// prompt, each by the id of a sequence that a new prompt with that prefix can fork from
// (PagedKvCache::ForkSequence) and go on computing from the block after.
//
// Entries are whole blocks: a prompt's prefix is held only where the cache's prefill cuts it
// (every chunk's end), so a prompt that goes on from an entry computes the same bits as one
// computed from its start. An entry is inserted only below its parent (one block shorter), so
// every entry's path is held; eviction takes the least recently used entry with nothing below
// it, and a lookup marks every entry on its path used.
//
// Not thread-safe: the scheduler thread that owns the cache owns its index.
#ifndef SLUICE_KVSTORE_CACHE_PREFIX_INDEX_H_
#define SLUICE_KVSTORE_CACHE_PREFIX_INDEX_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace sluice::kvstore {

// Names of a prompt's prefixes that hold across processes (a worker publishes those it caches,
// the router looks for a prompt's): element k names the first k + 1 blocks of `block_tokens`
// tokens, hashing each block after the name of those before it. Only whole blocks within the
// first `limit` tokens are named.
std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> tokens, int64_t block_tokens,
                                        int64_t limit);

class PrefixIndex {
 public:
  // `block_tokens` >= 1: the length of one block, the prefill's chunk.
  explicit PrefixIndex(int64_t block_tokens);

  struct Hit {
    int64_t tokens = 0;  // a multiple of block_tokens; 0: nothing held
    int64_t seq = -1;    // the sequence holding them
  };
  // The longest held prefix of `tokens` that is at most `limit` tokens long; marks every entry
  // on its path used.
  Hit Longest(absl::Span<const int32_t> tokens, int64_t limit);
  // The sequence of each entry on the path of `tokens`, block by block from the first, up to
  // the first block not held or `limit` tokens; marks nothing used.
  std::vector<int64_t> Path(absl::Span<const int32_t> tokens, int64_t limit) const;
  // Whether the first `length` tokens of `tokens` (whole blocks) are held.
  bool Holds(absl::Span<const int32_t> tokens, int64_t length) const;
  // Records `seq` as holding the first `length` tokens of `tokens` (a positive multiple of
  // block_tokens). False, and nothing recorded, when they are held already or the prefix one
  // block shorter is not.
  bool Insert(absl::Span<const int32_t> tokens, int64_t length, int64_t seq);
  // Removes the least recently used entry with no entry below it; its sequence, or nullopt
  // when the index is empty.
  std::optional<int64_t> EvictLeastRecent();
  // Removes every entry; their sequences.
  std::vector<int64_t> Clear();

  // The PrefixBlockHashes name of every entry's prefix.
  std::vector<uint64_t> Hashes() const;
  // Every entry's sequence.
  std::vector<int64_t> Sequences() const;

  int64_t size() const { return size_; }
  int64_t block_tokens() const { return block_; }

 private:
  struct Node {
    int64_t seq = -1;
    uint64_t used = 0;
    Node* parent = nullptr;
    uint64_t hash = 0;         // PrefixBlockHashes' name of the prefix up to this block
    std::vector<int32_t> key;  // this entry's block
    absl::flat_hash_map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  };
  // The child of `node` for block `b` of `tokens`, or null.
  const Node* Child(const Node& node, absl::Span<const int32_t> tokens, int64_t b) const;
  void Leaves(Node& node, std::vector<Node*>& out);
  // Calls fn(entry) for every entry below `node`, each before those below it.
  template <typename Fn>
  static void ForEachEntry(const Node& node, const Fn& fn) {
    for (const auto& [key, child] : node.children) {
      fn(*child);
      ForEachEntry(*child, fn);
    }
  }

  int64_t block_;
  Node root_;
  int64_t size_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_CACHE_PREFIX_INDEX_H_
