// A worker's grpc.health.v1 service as a client sees it: liveness and readiness follow the
// worker's stats, unknown services are NOT_FOUND, and everything is NOT_SERVING once the
// reporter is gone (shutdown).
#include "common/worker_health.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/admin_service.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace sluice {
namespace {

using HealthStatus = grpc::health::v1::HealthCheckResponse;

rpc::StatsResponse Stats(absl::Time loop_turned, const std::string& state, int64_t used,
                         int64_t free) {
  rpc::StatsResponse s;
  s.set_state(state);
  s.set_loop_turned_unix_ms(absl::ToUnixMillis(loop_turned));
  s.set_kv_pages_used(used);
  s.set_kv_pages_free(free);
  return s;
}

TEST(HealthOf, LiveWhileTheLoopTurnsReadyWhenItCanTakeARequest) {
  const absl::Time now = absl::Now();
  WorkerHealth h = HealthOf(Stats(now - absl::Milliseconds(300), "serving", 0, 0), now);
  EXPECT_TRUE(h.live);
  EXPECT_TRUE(h.ready);  // no pool made yet
  h = HealthOf(Stats(now, "serving", 10, 5), now);
  EXPECT_TRUE(h.live && h.ready);
  h = HealthOf(Stats(now, "serving", 10, 0), now);  // every page used
  EXPECT_TRUE(h.live);
  EXPECT_FALSE(h.ready);
  h = HealthOf(Stats(now, "draining", 10, 5), now);
  EXPECT_TRUE(h.live);
  EXPECT_FALSE(h.ready);
  h = HealthOf(Stats(now - kLoopStallBound - absl::Seconds(1), "serving", 10, 5), now);
  EXPECT_FALSE(h.live);
  EXPECT_FALSE(h.ready);
  EXPECT_FALSE(HealthOf(rpc::StatsResponse(), now).live);  // never turned
}

class WorkerHealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    // As a worker's: the health service serves beside the worker's own services.
    builder.RegisterService(&admin_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(server_->GetHealthCheckService(), nullptr);
    stub_ = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  // The status of `service`, or the call's error code as a negative number.
  int Check(const std::string& service) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    HealthStatus resp;
    const grpc::Status st = stub_->Check(&ctx, req, &resp);
    return st.ok() ? resp.status() : -static_cast<int>(st.error_code());
  }

  GrpcAuth auth_;
  AdminService admin_{auth_,
                      "w",
                      "decode",
                      "m",
                      [] { return rpc::StatsResponse(); },
                      [](bool) {},
                      [] { return int64_t{0}; }};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

TEST_F(WorkerHealthServiceTest, ClientsSeeTheWorkersHealthUntilShutdown) {
  std::atomic<bool> live{true}, ready{true};
  auto reporter = std::make_unique<WorkerHealthReporter>(
      server_->GetHealthCheckService(),
      [&] {
        return WorkerHealth{live, ready};
      },
      absl::Milliseconds(20));
  EXPECT_EQ(Check(kLivenessService), HealthStatus::SERVING);
  EXPECT_EQ(Check(kReadinessService), HealthStatus::SERVING);
  EXPECT_EQ(Check(""), HealthStatus::SERVING);
  EXPECT_EQ(Check("no.such.Service"), -static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ready = false;  // e.g. the pool is full: not ready, still live
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Check(kReadinessService) != HealthStatus::NOT_SERVING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Check(kReadinessService), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Check(""), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Check(kLivenessService), HealthStatus::SERVING);

  reporter.reset();  // the worker stops
  EXPECT_EQ(Check(kLivenessService), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Check(kReadinessService), HealthStatus::NOT_SERVING);
}

}  // namespace
}  // namespace sluice
