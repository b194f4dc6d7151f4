// Token authentication of the gRPC calls between sluice's processes (router -> workers): every
// call carries "authorization: Bearer <token>" metadata, a secret the processes share (a file:
// ./sluice up writes one per cluster, Kubernetes mounts a Secret); a worker answers a call
// without it UNAUTHENTICATED and counts it. gRPC's standard health service stays open (probes
// carry no credential). With no token configured, every call passes.
//
// Server side, each handler starts with `if (grpc::Status st = auth.Check(*ctx, "Reserve");
// !st.ok()) return st;` (gRPC 1.51's server interceptors cannot refuse a call); the worker test
// calls every method of every service without the token. Client side, one interceptor on the
// channel adds it to every call.
#ifndef SLUICE_COMMON_GRPC_AUTH_H_
#define SLUICE_COMMON_GRPC_AUTH_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace sluice {

class GrpcAuth {
 public:
  GrpcAuth() = default;  // no token: every call passes
  // The token in `path`, surrounding whitespace dropped: NotFound when the file cannot be read,
  // InvalidArgument when the token is shorter than 16 characters. An empty path: no token.
  static absl::StatusOr<GrpcAuth> FromFile(const std::string& path);
  // A worker's: FromFile, its refusals counted in `registry` (CountIn); without a token it says
  // on stderr that calls from anyone pass.
  static absl::StatusOr<GrpcAuth> ForWorker(const std::string& path, const std::string& name,
                                            prometheus::Registry& registry);
  // A fresh token: 32 random bytes from /dev/urandom, hex.
  static absl::StatusOr<std::string> NewToken();

  bool enabled() const { return !token_.empty(); }
  // Counts refused calls in sluice_grpc_unauthenticated_total{method} of `registry`.
  void CountIn(prometheus::Registry& registry);

  // OK when the call carries the token (compared in constant time) or none is configured;
  // UNAUTHENTICATED, counted under `method`, otherwise.
  grpc::Status Check(const grpc::ServerContext& ctx, const std::string& method) const;

  // A channel to `target` whose every call carries the token.
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         const grpc::ChannelArguments& args) const;

 private:
  std::string token_;
  std::string header_;  // "Bearer <token>", what a call's authorization metadata must be
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
};

// Whether two secrets are equal, in a time that depends on their lengths only.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// A secret kept in a file (a Kubernetes Secret's key, a file ./sluice up writes), surrounding
// whitespace dropped: NotFound when the file cannot be read, InvalidArgument when the secret is
// shorter than 16 characters; `what` names it in the error ("token", "API key").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// The caller of a server call as workers bound what one client may hold: the host of its peer
// address without the port ("ipv4:10.1.2.3", "ipv6:[::1]"; a unix socket's peer as it is), so a
// client's connections and reconnections count as one.
std::string PeerHost(const grpc::ServerContext& ctx);
std::string PeerHost(const std::string& peer);

}  // namespace sluice

#endif  // SLUICE_COMMON_GRPC_AUTH_H_
