// random_gguf: a GGUF like another with random weights (tools/random_gguf_lib.h).
//
//   random_gguf --like=MODEL.gguf --describe --out=desc.gguf   # metadata and tensor list, ~2 MB
//   random_gguf --like=desc.gguf --out=random.gguf [--seed=1]  # same metadata, random tensors
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/status_macros.h"
#include "model/gguf.h"
#include "model/test_util/gguf_writer.h"
#include "tools/random_gguf_lib.h"

ABSL_FLAG(std::string, like, "", "The GGUF (or a description of one) to copy.");
ABSL_FLAG(std::string, out, "", "Where to write the new GGUF.");
ABSL_FLAG(bool, describe, false,
          "Write --like's metadata and tensor list only (no tensor data), to make it elsewhere.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the random weights.");

namespace sluice {
namespace {

absl::Status Run() {
  const std::string like_path = absl::GetFlag(FLAGS_like), out = absl::GetFlag(FLAGS_out);
  if (like_path.empty() || out.empty()) {
    return absl::InvalidArgumentError("--like and --out are required");
  }
  SLUICE_ASSIGN_OR_RETURN(auto like, model::GgufFile::Open(like_path));
  absl::StatusOr<model::testing::GgufWriter> made =
      absl::GetFlag(FLAGS_describe) ? tools::DescribeGguf(*like)
                                    : tools::RandomGguf(*like, absl::GetFlag(FLAGS_seed));
  if (!made.ok()) return made.status();
  SLUICE_RETURN_IF_ERROR(
      made->WriteFile(out, like->version(), static_cast<uint32_t>(like->alignment())));
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "random_gguf: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
