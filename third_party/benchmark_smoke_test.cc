// Google Benchmark links and runs: a registered benchmark executes and its run is reported.
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "gtest/gtest.h"

namespace {

void BM_Accumulate(benchmark::State& state) {
  std::vector<float> v(state.range(0), 1.f);
  for (auto _ : state) {
    float sum = 0;
    for (float x : v) sum += x;
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Accumulate)->Arg(256);

class CollectingReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) names.push_back(r.benchmark_name());
    for (const Run& r : runs) iterations += r.iterations;
  }
  std::vector<std::string> names;
  int64_t iterations = 0;
};

TEST(BenchmarkSmoke, RunsRegisteredBenchmark) {
  char arg0[] = "benchmark_smoke_test";
  char arg1[] = "--benchmark_min_time=0.01";
  char* argv[] = {arg0, arg1};
  int argc = 2;
  benchmark::Initialize(&argc, argv);
  CollectingReporter reporter;
  EXPECT_EQ(benchmark::RunSpecifiedBenchmarks(&reporter), 1u);
  ASSERT_EQ(reporter.names.size(), 1u);
  EXPECT_EQ(reporter.names[0], "BM_Accumulate/256");
  EXPECT_GT(reporter.iterations, 0);
}

}  // namespace
