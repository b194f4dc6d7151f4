// The worker calls over gRPC: what the router's workers are (worker_calls.h).
#ifndef SLUICE_ROUTER_GRPC_WORKER_CALLS_H_
#define SLUICE_ROUTER_GRPC_WORKER_CALLS_H_

#include <memory>

#include "grpcpp/channel.h"
#include "router/worker_calls.h"

namespace sluice::router {

// Deadlines: Reserve 10 s, Renew 5 s, Release 2 s, Prefill 5 min (a prompt may queue).
std::unique_ptr<DecodeCalls> GrpcDecodeCalls(std::shared_ptr<grpc::Channel> channel);
std::unique_ptr<PrefillCalls> GrpcPrefillCalls(std::shared_ptr<grpc::Channel> channel);

}  // namespace sluice::router

#endif  // SLUICE_ROUTER_GRPC_WORKER_CALLS_H_
