// sluice-prefill: the prefill worker process. Serves the Prefill and Admin gRPC services on
// --port, writes KV pages over UCX into decode workers' pools, and exports Prometheus metrics
// on --metrics_port.
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/admin_service.h"
#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "common/process.h"
#include "common/worker_runtime.h"
#include "common/worker_server.h"
#include "model/model_path.h"
#include "prefill/prefill_worker.h"
#include "proto/sluice.grpc.pb.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, name, "prefill-0", "Worker name in metrics and status.");
ABSL_FLAG(int, port, 50100, "gRPC port (Prefill, Admin).");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address the gRPC and metrics servers bind.");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port; 0 = none.");
ABSL_FLAG(std::string, preset, "sluice", "KV compression preset for requests that name none.");
ABSL_FLAG(int64_t, kv_pages, 16384,
          "Pages of each preset's KV pool (at most 16 KiB each: a preset of one fixed-width tier "
          "trims its pages to the token groups they hold).");
ABSL_FLAG(int64_t, chunk_tokens, 512,
          "A prompt is cut every chunk_tokens from its start, one chunk a forward step (chunked "
          "prefill); its prefixes are cached in chunks.");
ABSL_FLAG(int64_t, step_tokens, 512,
          "Prompt tokens a forward step runs at most, a chunk from each of several prompts (at "
          "least one chunk).");
ABSL_FLAG(int64_t, prefix_cache_entries, 64,
          "Prompt prefixes kept for reuse (each chunk_tokens longer than the one it extends); a "
          "prompt that starts with a kept prefix computes only the tokens after it. 0: none.");
ABSL_FLAG(std::string, backend, "auto",
          "What computes: auto (CUDA where a GPU is usable, else the CPU), cpu or cuda.");
ABSL_FLAG(int, device, 0, "GPU for --backend=cuda|auto, as CUDA numbers the visible ones.");
ABSL_FLAG(bool, record_steps, true,
          "On CUDA, replay a small decode step's dense ops as CUDA graphs (recorded once per "
          "layer and row count); false launches every op one by one.");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = one per core.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the cluster token every gRPC call must carry (./sluice up writes one); "
          "empty: calls need none.");
ABSL_FLAG(std::string, kv_calibration, "",
          "Transform-coded wire: the calibration file (./sluice calibrate writes one beside the "
          "model); prefill and decode workers must load the same one.");
ABSL_FLAG(std::string, wire_bits, "",
          "Transform-coded wire: entropy-coded bits per key/value value (\"1.5/3\"), for presets "
          "that keep every token; empty: pages and state cross as they are held.");
ABSL_FLAG(int, max_presets, 4, "KV presets (each with its own page pool) kept at once.");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports (UCX_TLS), e.g. \"shm,tcp\"; empty: UCX's.");

namespace sluice {
namespace {

class PrefillService final : public rpc::Prefill::Service {
 public:
  PrefillService(prefill::PrefillWorker& worker, const GrpcAuth& auth)
      : worker_(worker), auth_(auth) {}
  grpc::Status Prefill(grpc::ServerContext* ctx, const rpc::PrefillRequest* request,
                       rpc::PrefillResponse* response) override {
    if (grpc::Status st = auth_.Check(*ctx, "Prefill.Prefill"); !st.ok()) return st;
    auto r = worker_.Prefill(*request);
    if (!r.ok()) return ToGrpc(r.status());
    *response = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  prefill::PrefillWorker& worker_;
  const GrpcAuth& auth_;
};

absl::Status Run() {
  if (absl::GetFlag(FLAGS_chunk_tokens) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--chunk_tokens=%d: a prefill step needs at least one token",
                        absl::GetFlag(FLAGS_chunk_tokens)));
  }
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  auto transport = transport::CreateUcxTransport({.transports = absl::GetFlag(FLAGS_ucx_tls)});
  if (!transport.ok()) return transport.status();
  auto runtime = WorkerRuntime::Create({.model_path = path,
                                        .backend = absl::GetFlag(FLAGS_backend),
                                        .device = absl::GetFlag(FLAGS_device),
                                        .record_steps = absl::GetFlag(FLAGS_record_steps),
                                        .threads = absl::GetFlag(FLAGS_threads),
                                        .kv_pages = absl::GetFlag(FLAGS_kv_pages),
                                        .default_preset = absl::GetFlag(FLAGS_preset),
                                        .max_presets = absl::GetFlag(FLAGS_max_presets),
                                        .kv_calibration = absl::GetFlag(FLAGS_kv_calibration),
                                        .wire_bits = absl::GetFlag(FLAGS_wire_bits)},
                                       transport->get());
  if (!runtime.ok()) return runtime.status();
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<GrpcAuth> auth = GrpcAuth::ForWorker(absl::GetFlag(FLAGS_auth_token_file),
                                                      absl::GetFlag(FLAGS_name), *registry);
  if (!auth.ok()) return auth.status();
  prefill::PrefillWorker worker(
      **runtime, **transport, *registry,
      {.name = absl::GetFlag(FLAGS_name),
       .chunk_tokens = absl::GetFlag(FLAGS_chunk_tokens),
       .step_tokens = absl::GetFlag(FLAGS_step_tokens),
       .prefix_cache_entries = absl::GetFlag(FLAGS_prefix_cache_entries)});
  PrefillService service(worker, *auth);
  AdminService admin(
      *auth, absl::GetFlag(FLAGS_name), "prefill", ServedModelName(path),
      [&] { return worker.Stats(); }, [&](bool on) { worker.Drain(on); },
      [&] { return worker.DropPrefixCache(); });

  return ServeWorker(
      {.name = absl::GetFlag(FLAGS_name),
       .banner =
           absl::StrFormat("prefill worker serving %s with backend %s (UCX %s)",
                           ServedModelName(path), (*runtime)->backend_name(), (*transport)->name()),
       .host = absl::GetFlag(FLAGS_host),
       .port = absl::GetFlag(FLAGS_port),
       .metrics_port = absl::GetFlag(FLAGS_metrics_port)},
      registry, {&service, &admin}, [&] { return worker.Stats(); }, [&] { worker.Drain(); });
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::ServerMain(argc, argv, "sluice-prefill", sluice::Run);
}
