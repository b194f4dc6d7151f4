// The cluster token on a real gRPC server and channel: calls without it, or with another, are
// UNAUTHENTICATED and counted by method; calls through a channel that carries it pass; the
// standard health service answers anyone (probes carry no credential); bad token files are
// refused naming the file.
#include "common/grpc_auth.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "common/admin_service.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "proto/health.grpc.pb.h"

namespace sluice {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

double Refused(prometheus::Registry& registry, const std::string& method) {
  for (const auto& family : registry.Collect()) {
    if (family.name != "sluice_grpc_unauthenticated_total") continue;
    for (const auto& m : family.metric) {
      for (const auto& label : m.label) {
        if (label.name == "method" && label.value == method) return m.counter.value;
      }
    }
  }
  return 0;
}

TEST(PeerHost, DropsThePortOnly) {
  EXPECT_EQ(PeerHost("ipv4:10.1.2.3:51234"), "ipv4:10.1.2.3");
  EXPECT_EQ(PeerHost("ipv6:[::1]:443"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:38476"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerHost("ipv6:::1"), "ipv6:::1");  // no bracket: no port to tell apart
  EXPECT_EQ(PeerHost("unix:/tmp/s.sock"), "unix:/tmp/s.sock");
  EXPECT_EQ(PeerHost(""), "");
}

TEST(ReadSecretFile, NamesWhatItReadsInItsErrors) {
  auto key = ReadSecretFile(WriteFile("key", "  0123456789abcdef0123\n"), "API key");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, "0123456789abcdef0123");
  auto short_key = ReadSecretFile(WriteFile("short-key", "abc"), "API key");
  EXPECT_EQ(short_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_key.status().message().find("the API key in"), std::string::npos);
  auto missing = ReadSecretFile("/no/such/key", "API key");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("API key file /no/such/key"), std::string::npos);
}

TEST(GrpcAuth, TokenFilesAreReadOrRefusedByName) {
  auto none = GrpcAuth::FromFile("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
  auto missing = GrpcAuth::FromFile("/no/such/token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/no/such/token"), std::string::npos);
  auto short_token = GrpcAuth::FromFile(WriteFile("short", "abc\n"));
  EXPECT_EQ(short_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_token.status().message().find("at least 16"), std::string::npos);
  auto token = GrpcAuth::NewToken();
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), 64u);
  EXPECT_NE(*token, *GrpcAuth::NewToken());
  auto good = GrpcAuth::FromFile(WriteFile("good", "  " + *token + "\n"));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->enabled());
}

TEST(GrpcAuth, CallsWithoutTheTokenAreRefusedAndCounted) {
  auto token = GrpcAuth::NewToken();
  ASSERT_TRUE(token.ok());
  auto auth = GrpcAuth::FromFile(WriteFile("token", *token));
  auto other = GrpcAuth::FromFile(WriteFile("other", *GrpcAuth::NewToken()));
  ASSERT_TRUE(auth.ok() && other.ok());
  prometheus::Registry registry;
  auth->CountIn(registry);
  int drains = 0, resets = 0;
  bool draining = false;
  AdminService admin(
      *auth, "w", "decode", "m", [] { return rpc::StatsResponse(); },
      [&](bool on) {
        ++drains;
        draining = on;
      },
      [&] { return int64_t{++resets * 10}; });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(port);
  const grpc::ChannelArguments args;

  const auto stats = [&](const GrpcAuth& client) {
    auto stub = rpc::Admin::NewStub(client.Channel(target, args));
    grpc::ClientContext ctx;
    rpc::StatsResponse out;
    return stub->Stats(&ctx, rpc::StatsRequest(), &out).error_code();
  };
  const auto drain = [&](const GrpcAuth& client, bool undo = false) {
    auto stub = rpc::Admin::NewStub(client.Channel(target, args));
    grpc::ClientContext ctx;
    rpc::DrainRequest request;
    request.set_undo(undo);
    rpc::DrainResponse out;
    const grpc::StatusCode code = stub->Drain(&ctx, request, &out).error_code();
    if (code == grpc::StatusCode::OK) EXPECT_EQ(out.draining(), !undo);
    return code;
  };
  EXPECT_EQ(stats(GrpcAuth()), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stats(*other), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(drain(GrpcAuth()), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(drains, 0);  // refused before the worker saw it
  EXPECT_EQ(Refused(registry, "Admin.Stats"), 2);
  EXPECT_EQ(Refused(registry, "Admin.Drain"), 1);
  EXPECT_EQ(stats(*auth), grpc::StatusCode::OK);
  EXPECT_EQ(drain(*auth), grpc::StatusCode::OK);
  EXPECT_EQ(drains, 1);
  EXPECT_TRUE(draining);
  // A drain is undone by the same call (and only with the token).
  EXPECT_EQ(drain(GrpcAuth(), /*undo=*/true), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(draining);
  EXPECT_EQ(drain(*auth, /*undo=*/true), grpc::StatusCode::OK);
  EXPECT_FALSE(draining);
  EXPECT_EQ(Refused(registry, "Admin.Stats"), 2);
  // Dropping the worker's prefixes, likewise.
  const auto reset = [&](const GrpcAuth& client, int64_t* dropped) {
    auto stub = rpc::Admin::NewStub(client.Channel(target, args));
    grpc::ClientContext ctx;
    rpc::ResetPrefixCacheResponse out;
    const grpc::StatusCode code =
        stub->ResetPrefixCache(&ctx, rpc::ResetPrefixCacheRequest(), &out).error_code();
    *dropped = out.entries_dropped();
    return code;
  };
  int64_t dropped = -1;
  EXPECT_EQ(reset(*other, &dropped), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(resets, 0);
  EXPECT_EQ(Refused(registry, "Admin.ResetPrefixCache"), 1);
  EXPECT_EQ(reset(*auth, &dropped), grpc::StatusCode::OK);
  EXPECT_EQ(resets, 1);
  EXPECT_EQ(dropped, 10);

  // Probes carry no credential: the health service answers them.
  auto health = grpc::health::v1::Health::NewStub(GrpcAuth().Channel(target, args));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  server->Shutdown();
}

}  // namespace
}  // namespace sluice
