// A model file like another but with random weights, for machines a real model cannot reach (a
// GPU machine's call carries 64 MiB; SmolLM2-135M's GGUF is 93 MB): DescribeGguf keeps a file's
// metadata (the tokenizer with it) and lists its tensors' names, types and shapes, in a few MB;
// RandomGguf makes, from a file or its description, a file with the same metadata and tensors of
// random values (norm weights near 1, the rest N(0, 1/sqrt(fan-in)), the embedding N(0, 1)).
#ifndef SLUICE_TOOLS_RANDOM_GGUF_LIB_H_
#define SLUICE_TOOLS_RANDOM_GGUF_LIB_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/test_util/gguf_writer.h"

namespace sluice::tools {

// The metadata key a description lists the tensors under: "name|ggml type id|d0,d1,...".
inline constexpr char kDescribedTensorsKey[] = "sluice.described_tensors";

// `like`'s metadata and the list of its tensors, no tensor data. InvalidArgument naming the key
// for metadata that cannot be copied (arrays of arrays).
// Write it with like's version and alignment (GgufWriter::WriteFile or Build).
absl::StatusOr<model::testing::GgufWriter> DescribeGguf(const model::GgufFile& like);

// `like`'s metadata (less the list) and a tensor of random values for each tensor it has, or,
// for a description, each it lists. InvalidArgument for a file with neither, or a listed tensor
// that does not parse or whose type cannot be written.
absl::StatusOr<model::testing::GgufWriter> RandomGguf(const model::GgufFile& like, uint64_t seed);

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_RANDOM_GGUF_LIB_H_
