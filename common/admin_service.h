// The Admin gRPC service every worker serves: health, stats, drain (and its undoing) and
// dropping its reusable prefixes, answered by callbacks into the worker, each call checked against
// the cluster token (grpc_auth.h).
#ifndef SLUICE_COMMON_ADMIN_SERVICE_H_
#define SLUICE_COMMON_ADMIN_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "common/grpc_auth.h"
#include "proto/sluice.grpc.pb.h"

namespace sluice {

class AdminService final : public rpc::Admin::Service {
 public:
  AdminService(const GrpcAuth& auth, std::string name, std::string role, std::string model,
               std::function<rpc::StatsResponse()> stats, std::function<void(bool)> drain,
               std::function<int64_t()> reset_prefix_cache)
      : auth_(auth),
        name_(std::move(name)),
        role_(std::move(role)),
        model_(std::move(model)),
        stats_(std::move(stats)),
        drain_(std::move(drain)),
        reset_prefix_cache_(std::move(reset_prefix_cache)) {}

  grpc::Status Health(grpc::ServerContext* ctx, const rpc::HealthRequest*,
                      rpc::HealthResponse* out) override {
    if (grpc::Status st = auth_.Check(*ctx, "Admin.Health"); !st.ok()) return st;
    const rpc::StatsResponse s = stats_();
    out->set_name(name_);
    out->set_role(role_);
    out->set_state(s.state());
    out->set_model(model_);
    return grpc::Status::OK;
  }
  grpc::Status Stats(grpc::ServerContext* ctx, const rpc::StatsRequest*,
                     rpc::StatsResponse* out) override {
    if (grpc::Status st = auth_.Check(*ctx, "Admin.Stats"); !st.ok()) return st;
    *out = stats_();
    return grpc::Status::OK;
  }
  grpc::Status Drain(grpc::ServerContext* ctx, const rpc::DrainRequest* request,
                     rpc::DrainResponse* out) override {
    if (grpc::Status st = auth_.Check(*ctx, "Admin.Drain"); !st.ok()) return st;
    drain_(!request->undo());
    out->set_draining(!request->undo());
    return grpc::Status::OK;
  }
  grpc::Status ResetPrefixCache(grpc::ServerContext* ctx, const rpc::ResetPrefixCacheRequest*,
                                rpc::ResetPrefixCacheResponse* out) override {
    if (grpc::Status st = auth_.Check(*ctx, "Admin.ResetPrefixCache"); !st.ok()) return st;
    out->set_entries_dropped(reset_prefix_cache_());
    return grpc::Status::OK;
  }

 private:
  const GrpcAuth& auth_;
  const std::string name_, role_, model_;
  std::function<rpc::StatsResponse()> stats_;
  std::function<void(bool)> drain_;              // true: drain; false: serve again
  std::function<int64_t()> reset_prefix_cache_;  // returns the entries dropped
};

}  // namespace sluice

#endif  // SLUICE_COMMON_ADMIN_SERVICE_H_
