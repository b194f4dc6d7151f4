#include "router/grpc_worker_calls.h"

#include <chrono>
#include <utility>

#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "proto/sluice.grpc.pb.h"

namespace sluice::router {
namespace {

void SetDeadline(grpc::ClientContext& ctx, absl::Duration d) {
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
}

class GrpcGeneration final : public GenerationStream {
 public:
  GrpcGeneration(rpc::Decode::Stub& stub, const rpc::GenerateRequest& request)
      : reader_(stub.Generate(&ctx_, request)) {}
  bool Read(rpc::GenerateResponse* message) override { return reader_->Read(message); }
  absl::Status Finish() override { return FromGrpc(reader_->Finish()); }
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;  // outlives the reader
  std::unique_ptr<grpc::ClientReader<rpc::GenerateResponse>> reader_;
};

class GrpcDecode final : public DecodeCalls {
 public:
  explicit GrpcDecode(std::shared_ptr<grpc::Channel> channel)
      : stub_(rpc::Decode::NewStub(std::move(channel))) {}

  absl::StatusOr<rpc::ReserveResponse> Reserve(const rpc::ReserveRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(10));
    rpc::ReserveResponse response;
    const grpc::Status st = stub_->Reserve(&ctx, request, &response);
    if (!st.ok()) return FromGrpc(st);
    return response;
  }
  absl::Status Renew(uint64_t reservation_id) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(5));
    rpc::RenewRequest request;
    request.set_reservation_id(reservation_id);
    rpc::RenewResponse ignored;
    return FromGrpc(stub_->Renew(&ctx, request, &ignored));
  }
  absl::Status Release(uint64_t reservation_id) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(2));
    rpc::ReleaseRequest request;
    request.set_reservation_id(reservation_id);
    rpc::ReleaseResponse ignored;
    return FromGrpc(stub_->Release(&ctx, request, &ignored));
  }
  std::unique_ptr<GenerationStream> Generate(const rpc::GenerateRequest& request) override {
    return std::make_unique<GrpcGeneration>(*stub_, request);
  }

 private:
  std::unique_ptr<rpc::Decode::Stub> stub_;
};

class GrpcPrefill final : public PrefillCalls {
 public:
  explicit GrpcPrefill(std::shared_ptr<grpc::Channel> channel)
      : stub_(rpc::Prefill::NewStub(std::move(channel))) {}
  absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Minutes(5));
    rpc::PrefillResponse response;
    const grpc::Status st = stub_->Prefill(&ctx, request, &response);
    if (!st.ok()) return FromGrpc(st);
    return response;
  }

 private:
  std::unique_ptr<rpc::Prefill::Stub> stub_;
};

}  // namespace

std::unique_ptr<DecodeCalls> GrpcDecodeCalls(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcDecode>(std::move(channel));
}

std::unique_ptr<PrefillCalls> GrpcPrefillCalls(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcPrefill>(std::move(channel));
}

}  // namespace sluice::router
