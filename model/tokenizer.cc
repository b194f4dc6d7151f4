#include "model/tokenizer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/gguf.h"
#include "model/unicode_utf8.h"

namespace sluice::model {
namespace {

// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100.. in byte order, so that every byte has a visible, non-space spelling.
struct ByteUnicode {
  std::array<char32_t, 256> char_of_byte;
  absl::flat_hash_map<char32_t, uint8_t> byte_of_char;
};

const ByteUnicode& ByteUnicodeTable() {
  static const ByteUnicode* table = [] {
    auto* t = new ByteUnicode;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t->char_of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      t->byte_of_char[t->char_of_byte[b]] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return *table;
}

// The bytes a normal token's spelling stands for. As Hugging Face's ByteLevel decoder, a
// spelling with a character outside the table stands for its own UTF-8 bytes.
std::string SpellingToBytes(std::string_view spelling) {
  const ByteUnicode& table = ByteUnicodeTable();
  std::string bytes;
  size_t pos = 0;
  while (pos < spelling.size()) {
    const auto it = table.byte_of_char.find(DecodeUtf8At(spelling, &pos));
    if (it == table.byte_of_char.end()) return std::string(spelling);
    bytes.push_back(static_cast<char>(it->second));
  }
  return bytes;
}

// Debian's Abseil has its own string_view type; its hash maps look keys up by that type.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsSpecialType(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUnknown ||
         type == TokenType::kUserDefined;
}

absl::Status CheckSpecialId(const char* what, int32_t id, size_t vocab_size) {
  if (id == -1 || (id >= 0 && static_cast<size_t>(id) < vocab_size)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s token id %d is outside the vocabulary of %d tokens", what, id, vocab_size));
}

// An optional integer token id: -1 when the key is absent.
absl::StatusOr<int32_t> OptionalTokenId(const GgufFile& gguf, std::string_view key) {
  if (gguf.Find(key) == nullptr) return -1;
  SLUICE_ASSIGN_OR_RETURN(int64_t id, gguf.GetInt(key));
  if (id < -1 || id > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s = %d is not a token id", key, id));
  }
  return static_cast<int32_t>(id);
}

}  // namespace

absl::StatusOr<VocabSpec> VocabFromGguf(const GgufFile& gguf) {
  SLUICE_ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrFormat(
        "tokenizer model \"%s\" (tokenizer.ggml.model in %s) is not supported; only \"gpt2\" "
        "(byte-level BPE) is",
        model, gguf.source()));
  }
  VocabSpec spec;
  if (gguf.Find("tokenizer.ggml.pre") != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(spec.pre_tokenizer, gguf.GetString("tokenizer.ggml.pre"));
  }
  if (absl::Status s = PreTokenizerFromName(spec.pre_tokenizer).status(); !s.ok()) {
    return absl::UnimplementedError(
        absl::StrCat(s.message(), " (tokenizer.ggml.pre in ", gguf.source(), ")"));
  }
  SLUICE_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                          gguf.GetStringArray("tokenizer.ggml.tokens"));
  spec.tokens = *tokens;
  SLUICE_ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                          gguf.GetStringArray("tokenizer.ggml.merges"));
  spec.merges = *merges;
  if (gguf.Find("tokenizer.ggml.token_type") != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(const std::vector<int64_t>* types,
                            gguf.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types = *types;
  }
  SLUICE_ASSIGN_OR_RETURN(spec.bos_id, OptionalTokenId(gguf, "tokenizer.ggml.bos_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.eos_id, OptionalTokenId(gguf, "tokenizer.ggml.eos_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.unk_id, OptionalTokenId(gguf, "tokenizer.ggml.unknown_token_id"));
  SLUICE_ASSIGN_OR_RETURN(spec.pad_id, OptionalTokenId(gguf, "tokenizer.ggml.padding_token_id"));
  if (gguf.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(spec.add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(VocabSpec spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("the vocabulary has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat("the vocabulary has %d tokens, too many", n));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d token types for %d tokens; there must be one per token", spec.token_types.size(), n));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer);
  SLUICE_ASSIGN_OR_RETURN(t->pre_tokenizer_, PreTokenizerFromName(spec.pre_tokenizer));
  SLUICE_RETURN_IF_ERROR(CheckSpecialId("bos", spec.bos_id, n));
  SLUICE_RETURN_IF_ERROR(CheckSpecialId("eos", spec.eos_id, n));
  SLUICE_RETURN_IF_ERROR(CheckSpecialId("unknown", spec.unk_id, n));
  SLUICE_RETURN_IF_ERROR(CheckSpecialId("padding", spec.pad_id, n));
  t->bos_id_ = spec.bos_id;
  t->eos_id_ = spec.eos_id;
  t->unk_id_ = spec.unk_id;
  t->pad_id_ = spec.pad_id;
  t->add_bos_ = spec.add_bos;

  t->tokens_.resize(n);
  t->id_of_text_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Token& token = t->tokens_[i];
    const int64_t type = spec.token_types.empty() ? 1 : spec.token_types[i];
    if (type < 1 || type > 6) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token %d has type %d; known types are 1 to 6", i, type));
    }
    if (absl::Status s = ValidateUtf8(spec.tokens[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, ": ", s.message()));
    }
    token.type = static_cast<TokenType>(type);
    token.text = std::move(spec.tokens[i]);
    token.bytes = IsSpecialType(token.type) ? token.text : SpellingToBytes(token.text);
    t->id_of_text_.try_emplace(token.text, static_cast<int32_t>(i));  // first spelling wins
    if (IsSpecialType(token.type) && !token.text.empty()) {
      t->special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  // Longest first, so that the first text matching at a position is the longest one.
  std::stable_sort(t->special_ids_.begin(), t->special_ids_.end(), [&](int32_t a, int32_t b) {
    return t->tokens_[a].text.size() > t->tokens_[b].text.size();
  });

  const ByteUnicode& table = ByteUnicodeTable();
  for (int b = 0; b < 256; ++b) {
    std::string spelling;
    AppendUtf8(table.char_of_byte[b], &spelling);
    const auto it = t->id_of_text_.find(spelling);
    t->byte_token_[b] = it == t->id_of_text_.end() ? -1 : it->second;
  }

  t->merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& merge = spec.merges[rank];
    const size_t space = merge.find(' ', 1);  // from 1: the left part may itself be " "
    if (space == std::string::npos || space + 1 == merge.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("merge %d (\"%s\") is not two tokens separated by a space", rank, merge));
    }
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    const auto l = t->id_of_text_.find(AsAbsl(left));
    const auto r = t->id_of_text_.find(AsAbsl(right));
    const auto m = t->id_of_text_.find(std::string(left).append(right));
    if (l == t->id_of_text_.end() || r == t->id_of_text_.end() || m == t->id_of_text_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "merge %d (\"%s\") names a token that is not in the vocabulary", rank, merge));
    }
    t->merges_.try_emplace(PairKey(l->second, r->second),
                           Merge{static_cast<int32_t>(rank), m->second});
  }
  return t;
}

absl::Status Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const {
  // Symbols form a linked list over the piece's bytes; candidate merges wait in a heap,
  // lowest rank first and leftmost among equal ranks (Hugging Face's Word::merge_all).
  // Entries made stale by an earlier merge are skipped when popped.
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t result;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    int32_t id = byte_token_[static_cast<uint8_t>(piece[i])];
    if (id < 0) {
      if (unk_id_ < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "byte 0x%02X has no token in this vocabulary and there is no unknown token",
            static_cast<uint8_t>(piece[i])));
      }
      id = unk_id_;
    }
    symbols[i] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Candidate> heap;
  auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, it->second.result});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    const Symbol& right = symbols[left.next];
    const auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.result != c.result) continue;  // stale
    const int32_t gone = left.next;
    left.id = c.result;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    symbols[gone].id = -1;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) ids->push_back(symbols[i].id);
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string_view> pieces;
  PreTokenize(pre_tokenizer_, text, &pieces);
  for (std::string_view piece : pieces) SLUICE_RETURN_IF_ERROR(EncodePiece(piece, ids));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool parse_special) const {
  SLUICE_RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Special tokens to look for, longest first, and the bytes they can start with.
  std::vector<int32_t> specials;
  std::array<bool, 256> starts{};
  for (int32_t id : special_ids_) {
    if (!parse_special && tokens_[id].type != TokenType::kUserDefined) continue;
    specials.push_back(id);
    starts[static_cast<uint8_t>(tokens_[id].text[0])] = true;
  }
  size_t plain = 0;  // start of the text not yet encoded
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t match = -1;
    if (starts[static_cast<uint8_t>(text[pos])]) {
      for (int32_t id : specials) {
        if (text.substr(pos).starts_with(tokens_[id].text)) {
          match = id;
          break;
        }
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    SLUICE_RETURN_IF_ERROR(EncodeText(text.substr(plain, pos - plain), &ids));
    ids.push_back(match);
    pos += tokens_[match].text.size();
    plain = pos;
  }
  SLUICE_RETURN_IF_ERROR(EncodeText(text.substr(plain), &ids));
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size()) {
      bytes.append(tokens_[id].bytes);
    } else {
      bytes.append(kUtf8Replacement);
    }
  }
  std::string text;
  text.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*final=*/true, &text);
  return text;
}

absl::Status Tokenizer::CheckIds(absl::Span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d at position %d is outside the vocabulary of %d tokens",
                          ids[i], i, vocab_size()));
    }
  }
  return absl::OkStatus();
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  return id >= 0 && id < vocab_size() ? std::string_view(tokens_[id].text) : std::string_view();
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  return id >= 0 && id < vocab_size() ? std::string_view(tokens_[id].bytes) : std::string_view();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && IsSpecialType(tokens_[id].type);
}

std::string StreamDecoder::Push(int32_t id) {
  if (id >= 0 && id < tokenizer_->vocab_size()) {
    pending_.append(tokenizer_->TokenBytes(id));
  } else {
    pending_.append(kUtf8Replacement);
  }
  std::string out;
  const size_t consumed = AppendUtf8Lossy(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  AppendUtf8Lossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace sluice::model
