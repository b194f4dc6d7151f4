// The Decode gRPC service over a DecodeWorker; every call checked against the cluster token.
#ifndef SLUICE_DECODE_DECODE_SERVICE_H_
#define SLUICE_DECODE_DECODE_SERVICE_H_

#include "common/grpc_auth.h"
#include "decode/decode_worker.h"
#include "proto/sluice.grpc.pb.h"

namespace sluice::decode {

class DecodeService final : public rpc::Decode::Service {
 public:
  DecodeService(DecodeWorker& worker, const GrpcAuth& auth) : worker_(worker), auth_(auth) {}

  grpc::Status Reserve(grpc::ServerContext* context, const rpc::ReserveRequest* request,
                       rpc::ReserveResponse* response) override;
  grpc::Status Renew(grpc::ServerContext* context, const rpc::RenewRequest* request,
                     rpc::RenewResponse* response) override;
  grpc::Status Release(grpc::ServerContext* context, const rpc::ReleaseRequest* request,
                       rpc::ReleaseResponse* response) override;
  // Streams tokens as the batch makes them; a client that goes away cancels the sequence.
  grpc::Status Generate(grpc::ServerContext* context, const rpc::GenerateRequest* request,
                        grpc::ServerWriter<rpc::GenerateResponse>* writer) override;

 private:
  DecodeWorker& worker_;
  const GrpcAuth& auth_;
};

}  // namespace sluice::decode

#endif  // SLUICE_DECODE_DECODE_SERVICE_H_
