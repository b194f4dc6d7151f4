#include "decode/decode_service.h"

#include <string>
#include <vector>

#include "common/grpc_status.h"

namespace sluice::decode {

grpc::Status DecodeService::Reserve(grpc::ServerContext* context,
                                    const rpc::ReserveRequest* request,
                                    rpc::ReserveResponse* response) {
  if (grpc::Status st = auth_.Check(*context, "Decode.Reserve"); !st.ok()) return st;
  auto r = worker_.Reserve(*request, PeerHost(*context));
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status DecodeService::Renew(grpc::ServerContext* context, const rpc::RenewRequest* request,
                                  rpc::RenewResponse* response) {
  if (grpc::Status st = auth_.Check(*context, "Decode.Renew"); !st.ok()) return st;
  auto r = worker_.Renew(request->reservation_id(), PeerHost(*context));
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status DecodeService::Release(grpc::ServerContext* context,
                                    const rpc::ReleaseRequest* request, rpc::ReleaseResponse*) {
  if (grpc::Status st = auth_.Check(*context, "Decode.Release"); !st.ok()) return st;
  return ToGrpc(worker_.Release(request->reservation_id(), PeerHost(*context)));
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context,
                                     const rpc::GenerateRequest* request,
                                     grpc::ServerWriter<rpc::GenerateResponse>* writer) {
  if (grpc::Status st = auth_.Check(*context, "Decode.Generate"); !st.ok()) return st;
  auto stream = worker_.Generate(*request, PeerHost(*context));
  if (!stream.ok()) return ToGrpc(stream.status());
  // An empty first message says the KV is in and the sequence runs: until it arrives the
  // router may still place the request elsewhere.
  if (!writer->Write(rpc::GenerateResponse())) {
    worker_.Cancel(*stream);
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  for (;;) {
    rpc::GenerateResponse out;
    bool done = false;
    absl::Status error;
    const bool ready = (*stream)->NextMessage(&out, &done, &error, absl::Milliseconds(20));
    if (context->IsCancelled()) {
      worker_.Cancel(*stream);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the generation");
    }
    if (!ready) continue;
    if (done && !error.ok() && out.tokens_size() == 0) return ToGrpc(error);
    if (!writer->Write(out)) {
      worker_.Cancel(*stream);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    if (done) return ToGrpc(error);
  }
}

}  // namespace sluice::decode
