#include "router/grpc_worker_calls.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
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

// A generation on gRPC's callback API: a stream waits in no thread. Read and Finish wait on
// the callbacks; ReadAsync and FinishAsync hand them on.
class GrpcGeneration final : public GenerationStream,
                             public grpc::ClientReadReactor<rpc::GenerateResponse> {
 public:
  GrpcGeneration(rpc::Decode::Stub& stub, const rpc::GenerateRequest& request) : request_(request) {
    stub.async()->Generate(&ctx_, &request_, this);
    // Held until the reading is over, so that OnDone cannot come while a read is still to start.
    AddHold();
    StartCall();
  }
  // The reactor must outlive OnDone: the call is cancelled and awaited.
  ~GrpcGeneration() override {
    ctx_.TryCancel();
    ReleaseHold();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  bool Read(rpc::GenerateResponse* message) override {
    std::mutex m;
    std::condition_variable cv;
    bool ready = false, ok = false;
    ReadAsync(message, [&](bool r) {
      std::lock_guard<std::mutex> lock(m);
      ok = r;
      ready = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return ready; });
    return ok;
  }
  absl::Status Finish() override {
    ReleaseHold();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return FromGrpc(status_);
  }
  void Cancel() override { ctx_.TryCancel(); }

  void ReadAsync(rpc::GenerateResponse* message, std::function<void(bool)> done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (released_) {  // the reading is over
        done(false);
        return;
      }
      read_done_ = std::move(done);
    }
    StartRead(message);
  }
  void FinishAsync(std::function<void(absl::Status)> done) override {
    ReleaseHold();
    std::unique_lock<std::mutex> lock(mu_);
    if (done_) {
      const grpc::Status st = status_;
      lock.unlock();
      done(FromGrpc(st));
      return;
    }
    finish_done_ = std::move(done);
  }

  void OnReadDone(bool ok) override {
    std::function<void(bool)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(read_done_);
    }
    if (!ok) ReleaseHold();
    done(ok);
  }
  void OnDone(const grpc::Status& status) override {
    std::function<void(absl::Status)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      done_ = true;
      done = std::move(finish_done_);
      cv_.notify_all();
    }
    // Last: `done` may destroy this generation.
    if (done) done(FromGrpc(status));
  }

 private:
  void ReleaseHold() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (released_) return;
      released_ = true;
    }
    RemoveHold();
  }

  grpc::ClientContext ctx_;
  const rpc::GenerateRequest request_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;  // the hold is removed: no read starts any more
  bool done_ = false;
  grpc::Status status_;
  std::function<void(bool)> read_done_;
  std::function<void(absl::Status)> finish_done_;
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
  absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request,
                                               CallCancel* cancel) override {
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Minutes(5));
    rpc::PrefillResponse response;
    if (cancel != nullptr) cancel->Bind([&ctx] { ctx.TryCancel(); });
    const grpc::Status st = stub_->Prefill(&ctx, request, &response);
    if (cancel != nullptr) cancel->Unbind();
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
