// Byte-level BPE tokenizer (GPT-2 family: tokenizer.ggml.model "gpt2"), built from a model's
// vocabulary, merges and token types; plus incremental detokenization for streaming.
//
//   SLUICE_ASSIGN_OR_RETURN(VocabSpec spec, VocabFromGguf(*gguf));
//   SLUICE_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::Create(std::move(spec)));
//   SLUICE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(prompt, true));
//   StreamDecoder stream(*tokenizer);
//   for (int32_t id : generated) Send(stream.Push(id));
//   Send(stream.Flush());
//
// Encoding matches Hugging Face `tokenizers` (and llama.cpp) for the supported
// pre-tokenizers: text → special-token split → pre-tokens → GPT-2 byte-to-unicode → BPE by
// merge rank.
#ifndef SLUICE_MODEL_TOKENIZER_H_
#define SLUICE_MODEL_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/unicode_pretokenizer.h"

namespace sluice::model {

class GgufFile;

// GGUF token types (tokenizer.ggml.token_type), numbered as in llama.cpp.
enum class TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a Tokenizer is built from, as stored in a GGUF file.
struct VocabSpec {
  // Token spellings; normal tokens in GPT-2's byte-to-unicode form ("Ġt" is " t"), control
  // and user-defined tokens as their literal text ("<|im_start|>").
  std::vector<std::string> tokens;
  std::vector<std::string> merges;        // "left right", by rank (first merges first)
  std::vector<int64_t> token_types;       // TokenType per token; empty: all normal
  std::string pre_tokenizer = "default";  // tokenizer.ggml.pre
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
  bool add_bos = false;  // whether prompts should start with bos (the caller adds it)
};

// Reads the tokenizer.ggml.* metadata. UnimplementedError naming the tokenizer model or
// pre-tokenizer when it is not one this file supports ("gpt2" with pre "smollm", "default"
// or "gpt-2"); NotFound/InvalidArgument from the reader when a required key is missing or
// has the wrong type.
absl::StatusOr<VocabSpec> VocabFromGguf(const GgufFile& gguf);

class Tokenizer {
 public:
  // Validates `spec` (ids in range, merges well-formed and naming known tokens, ...).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(VocabSpec spec);

  // Token ids for `text`, which must be valid UTF-8 (else InvalidArgumentError naming the
  // byte offset). With `parse_special`, the texts of control (and unknown) tokens, such as
  // "<|im_start|>", are matched leftmost-longest and become their ids; without it they are
  // ordinary text. User-defined tokens are always matched, as in Hugging Face and llama.cpp.
  // bos is never added; see add_bos().
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool parse_special) const;

  // The text of `ids`, with control tokens rendered as their text (Hugging Face decode
  // with skip_special_tokens=False). Bytes that do not form valid UTF-8 become U+FFFD, one
  // per maximal ill-formed subpart; an id outside [0, vocab_size()) becomes one U+FFFD
  // (use CheckIds first where ids come from a user).
  std::string Decode(absl::Span<const int32_t> ids) const;

  // InvalidArgumentError naming the first id outside [0, vocab_size()) and its position.
  absl::Status CheckIds(absl::Span<const int32_t> ids) const;

  // The vocabulary spelling of `id` ("Ġt"); empty when out of range.
  std::string_view TokenText(int32_t id) const;
  // The bytes `id` stands for (" t"; "<|im_start|>" for control tokens); empty when out of
  // range. May be part of a UTF-8 sequence.
  std::string_view TokenBytes(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  // Control, unknown and user-defined tokens: those not produced by BPE over bytes.
  bool IsSpecial(int32_t id) const;

 private:
  struct Token {
    std::string text;   // vocabulary spelling
    std::string bytes;  // what it decodes to
    TokenType type = TokenType::kNormal;
  };
  struct Merge {
    int32_t rank;
    int32_t result;  // id of the merged token
  };

  Tokenizer() = default;

  // Appends the BPE tokens of one pre-token.
  absl::Status EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const;
  // Appends the tokens of `text` (no special tokens in it).
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>* ids) const;

  std::vector<Token> tokens_;
  absl::flat_hash_map<std::string, int32_t> id_of_text_;  // by vocabulary spelling
  absl::flat_hash_map<uint64_t, Merge> merges_;           // key: left id << 32 | right id
  std::array<int32_t, 256> byte_token_;                   // single-byte token, or -1
  // Tokens matched in raw text before pre-tokenization, longest first.
  std::vector<int32_t> special_ids_;
  PreTokenizer pre_tokenizer_ = PreTokenizer::kGpt2;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, pad_id_ = -1;
  bool add_bos_ = false;
};

// Incremental detokenization for streaming: Push returns the text a token completes, never
// half a UTF-8 character (incomplete trailing bytes are held until a later token completes
// them). The concatenation of every Push and the final Flush equals Decode of all the ids.
// The Tokenizer must outlive the StreamDecoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  std::string Push(int32_t id);
  // Emits what is held back (a cut-off sequence becomes U+FFFD) and resets.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes that may be the start of an unfinished UTF-8 character
};

}  // namespace sluice::model

#endif  // SLUICE_MODEL_TOKENIZER_H_
