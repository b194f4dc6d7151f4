// Comma-separated lists of positive integers, as the benchmarks' flags take them
// ("1,4,16", "1024,4096").
#ifndef SLUICE_BENCH_INT_LIST_H_
#define SLUICE_BENCH_INT_LIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::bench {

// InvalidArgument naming the first entry that is not a positive integer.
absl::StatusOr<std::vector<int>> ParseIntList(const std::string& s);

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_INT_LIST_H_
