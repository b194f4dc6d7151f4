// sluice-decode: the decode worker process. Serves the Decode and Admin gRPC services on
// --port, receives KV pages over UCX (into a window per reservation, then its page pools), and
// exports Prometheus metrics on
// --metrics_port.
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/admin_service.h"
#include "common/grpc_auth.h"
#include "common/process.h"
#include "common/worker_runtime.h"
#include "common/worker_server.h"
#include "decode/decode_service.h"
#include "decode/decode_worker.h"
#include "model/model_path.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, name, "decode-0", "Worker name in metrics and status.");
ABSL_FLAG(int, port, 50200, "gRPC port (Decode, Admin).");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address the gRPC and metrics servers bind.");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port; 0 = none.");
ABSL_FLAG(std::string, preset, "sluice", "KV compression preset for requests that name none.");
ABSL_FLAG(int64_t, kv_pages, 32768,
          "Pages of each preset's KV pool (at most 16 KiB each: a preset of one fixed-width tier "
          "trims its pages to the token groups they hold).");
ABSL_FLAG(int, max_batch, 64, "Sequences in one decode step.");
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
ABSL_FLAG(int, max_presets, 4, "KV presets (each with its own page pool) kept at once.");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports (UCX_TLS), e.g. \"shm,tcp\"; empty: UCX's.");
ABSL_FLAG(double, reservation_ttl, 60,
          "Seconds a reservation waits for its pages (the prompt's prefill queue included).");
ABSL_FLAG(double, max_client_reserved_fraction, 0.5,
          "Share of a pool's pages one client (a peer host) may hold in reservations at once; "
          "its first reservation is always admitted.");
ABSL_FLAG(int, max_client_reservations, 1024, "Reservations one client may hold at once.");
ABSL_FLAG(int, held_prefix_entries, 64,
          "Prompt prefixes whose KV pages are kept for later prompts that begin the same way "
          "(their prefill worker then sends only the other pages); 0: none.");

namespace sluice {
namespace {

absl::Status Run() {
  const std::string path =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  if (const double f = absl::GetFlag(FLAGS_max_client_reserved_fraction); !(f > 0 && f <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max_client_reserved_fraction=%g: must be in (0, 1]", f));
  }
  if (absl::GetFlag(FLAGS_max_client_reservations) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max_client_reservations=%d: must be at least 1",
                        absl::GetFlag(FLAGS_max_client_reservations)));
  }
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
                                        .receiver = true,
                                        .kv_calibration = absl::GetFlag(FLAGS_kv_calibration)},
                                       transport->get());
  if (!runtime.ok()) return runtime.status();
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<GrpcAuth> auth = GrpcAuth::ForWorker(absl::GetFlag(FLAGS_auth_token_file),
                                                      absl::GetFlag(FLAGS_name), *registry);
  if (!auth.ok()) return auth.status();
  decode::DecodeWorker worker(
      **runtime, *registry,
      {.name = absl::GetFlag(FLAGS_name),
       .max_batch = absl::GetFlag(FLAGS_max_batch),
       .reservation_ttl = absl::Seconds(absl::GetFlag(FLAGS_reservation_ttl)),
       .max_client_reserved_fraction = absl::GetFlag(FLAGS_max_client_reserved_fraction),
       .max_client_reservations = absl::GetFlag(FLAGS_max_client_reservations),
       .held_prefix_entries = absl::GetFlag(FLAGS_held_prefix_entries)});
  decode::DecodeService decode_service(worker, *auth);
  AdminService admin(
      *auth, absl::GetFlag(FLAGS_name), "decode", ServedModelName(path),
      [&] { return worker.Stats(); }, [&](bool on) { worker.Drain(on); },
      [&] { return worker.DropHeldPrefixes(); });

  return ServeWorker(
      {.name = absl::GetFlag(FLAGS_name),
       .banner =
           absl::StrFormat("decode worker serving %s with backend %s (UCX %s)",
                           ServedModelName(path), (*runtime)->backend_name(), (*transport)->name()),
       .host = absl::GetFlag(FLAGS_host),
       .port = absl::GetFlag(FLAGS_port),
       .metrics_port = absl::GetFlag(FLAGS_metrics_port)},
      registry, {&decode_service, &admin}, [&] { return worker.Stats(); }, [&] { worker.Drain(); });
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  return sluice::ServerMain(argc, argv, "sluice-decode", sluice::Run);
}
