#include "kvstore/cache/prefix_index.h"

#include <algorithm>
#include <utility>

namespace sluice::kvstore {
namespace {

// SplitMix64's finalizer: a fixed function, the same in every process (absl::Hash is seeded
// per process).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t RootHash(int64_t block) { return Mix(static_cast<uint64_t>(block)); }

uint64_t ChainBlock(uint64_t h, absl::Span<const int32_t> block) {
  for (int32_t t : block) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace

std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> tokens, int64_t block_tokens,
                                        int64_t limit) {
  std::vector<uint64_t> out;
  if (block_tokens <= 0) return out;
  const int64_t blocks =
      std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / block_tokens;
  uint64_t h = RootHash(block_tokens);
  for (int64_t b = 0; b < blocks; ++b) {
    h = ChainBlock(h, tokens.subspan(b * block_tokens, block_tokens));
    out.push_back(h);
  }
  return out;
}

PrefixIndex::PrefixIndex(int64_t block_tokens) : block_(std::max<int64_t>(block_tokens, 1)) {
  root_.hash = RootHash(block_);
}

const PrefixIndex::Node* PrefixIndex::Child(const Node& node, absl::Span<const int32_t> tokens,
                                            int64_t b) const {
  const std::vector<int32_t> key(tokens.begin() + b * block_, tokens.begin() + (b + 1) * block_);
  auto it = node.children.find(key);
  return it == node.children.end() ? nullptr : it->second.get();
}

PrefixIndex::Hit PrefixIndex::Longest(absl::Span<const int32_t> tokens, int64_t limit) {
  const int64_t blocks = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / block_;
  Hit hit;
  const Node* node = &root_;
  ++clock_;
  for (int64_t b = 0; b < blocks; ++b) {
    node = Child(*node, tokens, b);
    if (node == nullptr) break;
    const_cast<Node*>(node)->used = clock_;
    hit = {.tokens = (b + 1) * block_, .seq = node->seq};
  }
  return hit;
}

std::vector<int64_t> PrefixIndex::Path(absl::Span<const int32_t> tokens, int64_t limit) const {
  const int64_t blocks = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size())) / block_;
  std::vector<int64_t> out;
  const Node* node = &root_;
  for (int64_t b = 0; b < blocks; ++b) {
    node = Child(*node, tokens, b);
    if (node == nullptr) break;
    out.push_back(node->seq);
  }
  return out;
}

bool PrefixIndex::Holds(absl::Span<const int32_t> tokens, int64_t length) const {
  if (length <= 0 || length % block_ != 0 || length > static_cast<int64_t>(tokens.size())) {
    return false;
  }
  const Node* node = &root_;
  for (int64_t b = 0; b < length / block_ && node != nullptr; ++b) node = Child(*node, tokens, b);
  return node != nullptr;
}

bool PrefixIndex::Insert(absl::Span<const int32_t> tokens, int64_t length, int64_t seq) {
  if (length <= 0 || length % block_ != 0 || length > static_cast<int64_t>(tokens.size())) {
    return false;
  }
  const int64_t blocks = length / block_;
  const Node* parent = &root_;
  for (int64_t b = 0; b + 1 < blocks && parent != nullptr; ++b) parent = Child(*parent, tokens, b);
  if (parent == nullptr || Child(*parent, tokens, blocks - 1) != nullptr) return false;
  auto node = std::make_unique<Node>();
  node->seq = seq;
  node->used = ++clock_;
  node->parent = const_cast<Node*>(parent);
  node->key.assign(tokens.begin() + (blocks - 1) * block_, tokens.begin() + blocks * block_);
  node->hash = ChainBlock(parent->hash, node->key);
  Node* p = node->parent;
  p->children.emplace(node->key, std::move(node));
  for (; p != &root_; p = p->parent) p->used = clock_;
  ++size_;
  return true;
}

void PrefixIndex::Leaves(Node& node, std::vector<Node*>& out) {
  for (auto& [key, child] : node.children) {
    if (child->children.empty()) {
      out.push_back(child.get());
    } else {
      Leaves(*child, out);
    }
  }
}

std::optional<int64_t> PrefixIndex::EvictLeastRecent() {
  std::vector<Node*> leaves;
  Leaves(root_, leaves);
  if (leaves.empty()) return std::nullopt;
  Node* oldest = *std::min_element(leaves.begin(), leaves.end(),
                                   [](const Node* a, const Node* b) { return a->used < b->used; });
  const int64_t seq = oldest->seq;
  const std::vector<int32_t> key = oldest->key;  // erase destroys the node that holds it
  oldest->parent->children.erase(key);
  --size_;
  return seq;
}

std::vector<uint64_t> PrefixIndex::Hashes() const {
  std::vector<uint64_t> out;
  ForEachEntry(root_, [&](const Node& n) { out.push_back(n.hash); });
  return out;
}

std::vector<int64_t> PrefixIndex::Sequences() const {
  std::vector<int64_t> out;
  ForEachEntry(root_, [&](const Node& n) { out.push_back(n.seq); });
  return out;
}

std::vector<int64_t> PrefixIndex::Clear() {
  std::vector<int64_t> seqs;
  while (std::optional<int64_t> seq = EvictLeastRecent()) seqs.push_back(*seq);
  return seqs;
}

}  // namespace sluice::kvstore
