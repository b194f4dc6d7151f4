#include "common/grpc_auth.h"

#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/interceptor.h"

namespace sluice {
namespace {

constexpr char kHeader[] = "authorization";
constexpr size_t kMinTokenBytes = 16;

// Adds the token to each call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kHeader, *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string value) : value_(std::move(value)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read the %s file %s", what, path));
  std::stringstream text;
  text << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(text.str()));
  if (secret.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s in %s has %d characters; at least %d are needed", what, path,
                        secret.size(), kMinTokenBytes));
  }
  return secret;
}

absl::StatusOr<GrpcAuth> GrpcAuth::FromFile(const std::string& path) {
  GrpcAuth auth;
  if (path.empty()) return auth;
  absl::StatusOr<std::string> token = ReadSecretFile(path, "token");
  if (!token.ok()) return token.status();
  auth.token_ = *std::move(token);
  auth.header_ = absl::StrCat("Bearer ", auth.token_);
  return auth;
}

absl::StatusOr<GrpcAuth> GrpcAuth::ForWorker(const std::string& path, const std::string& name,
                                             prometheus::Registry& registry) {
  absl::StatusOr<GrpcAuth> auth = FromFile(path);
  if (!auth.ok()) return auth.status();
  auth->CountIn(registry);
  if (!auth->enabled()) {
    std::cerr << name
              << ": no --auth_token_file: gRPC calls from anyone who can reach this "
                 "worker pass\n";
  }
  return auth;
}

absl::StatusOr<std::string> GrpcAuth::NewToken() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  std::string bytes(32, '\0');
  if (!random.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::UnavailableError("cannot read /dev/urandom for a token");
  }
  return absl::BytesToHexString(bytes);
}

void GrpcAuth::CountIn(prometheus::Registry& registry) {
  refused_ = &prometheus::BuildCounter()
                  .Name("sluice_grpc_unauthenticated_total")
                  .Help("gRPC calls refused for a missing or wrong token, by method")
                  .Register(registry);
}

grpc::Status GrpcAuth::Check(const grpc::ServerContext& ctx, const std::string& method) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(kHeader);
  if (it != metadata.end() &&
      ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), header_)) {
    return grpc::Status::OK;
  }
  if (refused_ != nullptr) refused_->Add({{"method", method}}).Increment();
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat(method,
                                   ": missing or wrong cluster token (authorization "
                                   "metadata; --auth_token_file)"));
}

std::shared_ptr<grpc::Channel> GrpcAuth::Channel(const std::string& target,
                                                 const grpc::ChannelArguments& args) const {
  if (!enabled()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(header_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, grpc::InsecureChannelCredentials(), args, std::move(factories));
}

std::string PeerHost(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  if (colon <= 4) return peer;
  const std::string host = peer.substr(0, colon);
  // "ipv6:[::1]:443" (or with the brackets escaped, %5B::1%5D): the port follows the bracket.
  if (absl::StartsWith(peer, "ipv6:") && !absl::EndsWith(host, "]") &&
      !absl::EndsWith(host, "%5D")) {
    return peer;
  }
  return host;
}

std::string PeerHost(const grpc::ServerContext& ctx) { return PeerHost(ctx.peer()); }

}  // namespace sluice
