// sluice up: a local cluster on this machine: N prefill workers, M decode workers and the
// router, serving the bundled model. Prints the URL and a curl example once the router says it
// is healthy; Ctrl-C (SIGINT) or SIGTERM stops every process. It supervises them: one that dies
// is started again with the same flags after a backoff (1 s doubling to 30 s) and rejoins,
// while the others keep serving. A process that dies while the cluster starts stops them all.
//
//   ./sluice up [--prefill 1] [--decode 1] [--preset sluice] [--port 8000] [--backend auto]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_auth.h"
#include "common/process.h"
#include "httplib.h"
#include "model/model_path.h"

ABSL_FLAG(int, prefill, 1, "Prefill workers.");
ABSL_FLAG(int, decode, 1, "Decode workers.");
ABSL_FLAG(std::string, preset, "sluice", "KV compression preset for requests that name none.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address every process binds.");
ABSL_FLAG(int, port, 8000, "The router's HTTP port.");
ABSL_FLAG(int, prefill_port, 50100, "gRPC port of the first prefill worker (then +1 each).");
ABSL_FLAG(int, decode_port, 50200, "gRPC port of the first decode worker (then +1 each).");
ABSL_FLAG(int, metrics_port, 9100,
          "Metrics of prefill worker i on this port + 1 + i, of decode worker j on + 101 + j.");
ABSL_FLAG(int64_t, kv_pages, 32768, "Pages (16 KiB) of each decode worker's KV pool per preset.");
ABSL_FLAG(int, threads, 0, "CPU threads of each worker; 0 = one per core.");
ABSL_FLAG(int64_t, chunk_tokens, 512,
          "Prompt tokens per prefill step; prompts are cut (and their prefixes cached) every "
          "chunk_tokens from their start.");
ABSL_FLAG(int64_t, step_tokens, 512,
          "Prompt tokens a prefill step runs at most, a chunk from each of several prompts.");
ABSL_FLAG(int64_t, prefix_cache_entries, 64,
          "Prompt prefixes each prefill worker keeps for reuse, and each decode worker keeps "
          "the pages of; 0: none.");
ABSL_FLAG(std::string, backend, "auto",
          "What the workers compute on: auto (CUDA where a GPU is usable, else the CPU), cpu or "
          "cuda.");
ABSL_FLAG(int, device, 0, "GPU every worker uses with --backend=cuda|auto.");
ABSL_FLAG(bool, record_steps, true,
          "Workers on CUDA replay small decode steps as CUDA graphs; false: every op launched.");
ABSL_FLAG(std::string, kv_calibration, "",
          "Transform-coded wire: the calibration file; empty = beside the model (.kvtc) when "
          "there is one (./sluice calibrate).");
ABSL_FLAG(std::string, wire_bits, "",
          "Transform-coded wire: entropy-coded bits per key/value value (\"1.5/3\") for the "
          "prompts' KV of presets that keep every token; empty: pages cross as they are held.");
ABSL_FLAG(std::string, model, "", "GGUF model path (default: $SLUICE_MODEL, else the cache).");
ABSL_FLAG(std::string, bin_dir, "", "Where the prefill/, decode/ and router/ binaries are.");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports for the page streams; empty: UCX's choice.");
ABSL_FLAG(std::string, placement, "prefix_affinity", "The router's placement policy.");
ABSL_FLAG(int, max_migrations, 3,
          "The router's: times a generation moves when its decode worker fails or stalls.");
ABSL_FLAG(double, stall_timeout, 10,
          "The router's: seconds a generation may send nothing before it counts as stalled.");
ABSL_FLAG(std::string, auth_token_file, "",
          "The cluster token file every gRPC call between the processes carries; empty: a fresh "
          "token in a private temporary file, removed at exit.");

namespace sluice {
namespace {

struct Child {
  std::string name;
  pid_t pid = 0;
  std::vector<std::string> argv;  // to start it again
  // Supervision once the cluster is up: when it may start again, and how long the wait after
  // its next exit is (1 s, doubling to 30 s; back to 1 s after a minute up).
  std::chrono::steady_clock::time_point restart_at, started_at;
  std::chrono::seconds backoff{1};
};

pid_t Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Children start with the default signal mask: only this process waits for signals.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], nullptr, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  return rc == 0 ? pid : -1;
}

void StopAll(std::vector<Child>& children) {
  for (const Child& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Child& c : children) {
    while (c.pid > 0) {
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = 0;
      } else if (std::chrono::steady_clock::now() > deadline) {
        std::cerr << "sluice up: " << c.name << " did not stop in time; killing it\n";
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = 0;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

// The child that has exited, if any (reaped; its pid set to 0), and how in `why`; null otherwise.
Child* Exited(std::vector<Child>& children, std::string* why) {
  for (Child& c : children) {
    int status = 0;
    if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.pid = 0;
      *why = WIFEXITED(status)
                 ? absl::StrFormat("%s exited with status %d", c.name, WEXITSTATUS(status))
                 : absl::StrFormat("%s was killed by signal %d", c.name, WTERMSIG(status));
      return &c;
    }
  }
  return nullptr;
}

// The cluster's token file: `given`, or a fresh token written to a new file only this user can
// read (removed by the caller); empty on failure, said on stderr.
std::string TokenFile(const std::string& given, bool* made) {
  *made = false;
  if (!given.empty()) return given;
  absl::StatusOr<std::string> token = GrpcAuth::NewToken();
  if (!token.ok()) {
    std::cerr << "sluice up: " << token.status().message() << "\n";
    return "";
  }
  const char* tmp = getenv("TMPDIR");
  std::string path =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/sluice-up-token-XXXXXX");
  const int fd = mkstemp(path.data());  // mode 0600
  if (fd < 0 || write(fd, token->data(), token->size()) != static_cast<ssize_t>(token->size())) {
    std::cerr << "sluice up: cannot write a token file in " << path << "\n";
    if (fd >= 0) close(fd);
    return "";
  }
  close(fd);
  *made = true;
  return path;
}

int Run(const char* argv0) {
  std::string bin = absl::GetFlag(FLAGS_bin_dir);
  if (bin.empty()) {
    const std::string self = argv0;
    bin = self.substr(0, self.find_last_of('/')) + "/..";
  }
  const std::string model =
      absl::GetFlag(FLAGS_model).empty() ? model::DefaultModelPath() : absl::GetFlag(FLAGS_model);
  const std::string host = absl::GetFlag(FLAGS_host);
  const int n_prefill = absl::GetFlag(FLAGS_prefill), n_decode = absl::GetFlag(FLAGS_decode);
  if (n_prefill < 1 || n_decode < 1) {
    std::cerr << "sluice up: --prefill and --decode need at least 1 worker each\n";
    return 2;
  }
  const std::string threads = absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads));
  // Workers that share cores must not spin-wait in OpenMP: a spinning team starves the other
  // process's (measured on 2 cores, mixed prefill and decode: 1.75x the tokens/s).
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int per_worker = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : cores;
  if ((n_prefill + n_decode) * per_worker > cores && getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  }
  bool made_token = false;
  const std::string token_file = TokenFile(absl::GetFlag(FLAGS_auth_token_file), &made_token);
  if (token_file.empty()) return 1;
  struct RemoveToken {
    const std::string& path;
    bool made;
    ~RemoveToken() {
      if (made) unlink(path.c_str());
    }
  } remove_token{token_file, made_token};
  const std::string auth_flag = "--auth_token_file=" + token_file;
  std::string calibration = absl::GetFlag(FLAGS_kv_calibration);
  if (calibration.empty() && std::filesystem::exists(model::KvCalibrationPath(model))) {
    calibration = model::KvCalibrationPath(model);
  }
  if (!absl::GetFlag(FLAGS_wire_bits).empty() && calibration.empty()) {
    std::cerr << "sluice up: --wire_bits needs a calibration: run ./sluice calibrate (it writes "
              << model::KvCalibrationPath(model) << ") or give --kv_calibration\n";
    return 1;
  }
  const std::string common_flags[] = {
      "--model=" + model,
      auth_flag,
      "--host=" + host,
      "--preset=" + absl::GetFlag(FLAGS_preset),
      threads,
      "--backend=" + absl::GetFlag(FLAGS_backend),
      absl::StrCat("--device=", absl::GetFlag(FLAGS_device)),
      absl::StrCat("--record_steps=", absl::GetFlag(FLAGS_record_steps) ? "true" : "false"),
      "--ucx_tls=" + absl::GetFlag(FLAGS_ucx_tls),
      "--kv_calibration=" + calibration};
  std::vector<Child> children;
  std::vector<std::string> prefill_addrs, decode_addrs, metrics;
  auto start = [&](const std::string& name, std::vector<std::string> argv) {
    const pid_t pid = Spawn(argv);
    if (pid < 0) {
      std::cerr << "sluice up: cannot start " << argv[0] << "\n";
      return false;
    }
    children.push_back(
        {.name = name, .pid = pid, .argv = argv, .started_at = std::chrono::steady_clock::now()});
    return true;
  };
  bool ok = true;
  for (int j = 0; j < n_decode && ok; ++j) {
    const int port = absl::GetFlag(FLAGS_decode_port) + j;
    const int mport = absl::GetFlag(FLAGS_metrics_port) + 101 + j;
    decode_addrs.push_back(absl::StrFormat("%s:%d", host, port));
    metrics.push_back(absl::StrFormat("http://%s:%d/metrics", host, mport));
    std::vector<std::string> argv = {
        bin + "/decode/decode",
        absl::StrFormat("--name=decode-%d", j),
        absl::StrFormat("--port=%d", port),
        absl::StrFormat("--metrics_port=%d", mport),
        absl::StrFormat("--kv_pages=%d", absl::GetFlag(FLAGS_kv_pages)),
        absl::StrCat("--held_prefix_entries=", absl::GetFlag(FLAGS_prefix_cache_entries))};
    argv.insert(argv.end(), std::begin(common_flags), std::end(common_flags));
    ok = start(absl::StrFormat("decode-%d", j), argv);
  }
  for (int i = 0; i < n_prefill && ok; ++i) {
    const int port = absl::GetFlag(FLAGS_prefill_port) + i;
    const int mport = absl::GetFlag(FLAGS_metrics_port) + 1 + i;
    prefill_addrs.push_back(absl::StrFormat("%s:%d", host, port));
    metrics.push_back(absl::StrFormat("http://%s:%d/metrics", host, mport));
    std::vector<std::string> argv = {
        bin + "/prefill/prefill",
        absl::StrFormat("--name=prefill-%d", i),
        absl::StrFormat("--port=%d", port),
        absl::StrFormat("--metrics_port=%d", mport),
        "--wire_bits=" + absl::GetFlag(FLAGS_wire_bits),
        absl::StrCat("--chunk_tokens=", absl::GetFlag(FLAGS_chunk_tokens)),
        absl::StrCat("--step_tokens=", absl::GetFlag(FLAGS_step_tokens)),
        absl::StrCat("--prefix_cache_entries=", absl::GetFlag(FLAGS_prefix_cache_entries))};
    argv.insert(argv.end(), std::begin(common_flags), std::end(common_flags));
    ok = start(absl::StrFormat("prefill-%d", i), argv);
  }
  const int port = absl::GetFlag(FLAGS_port);
  if (ok) {
    ok = start("router", {bin + "/router/router", "--model=" + model, "--host=" + host,
                          absl::StrFormat("--port=%d", port),
                          "--prefill=" + absl::StrJoin(prefill_addrs, ","),
                          "--decode=" + absl::StrJoin(decode_addrs, ","),
                          "--placement=" + absl::GetFlag(FLAGS_placement), auth_flag,
                          absl::StrCat("--max_migrations=", absl::GetFlag(FLAGS_max_migrations)),
                          absl::StrCat("--stall_timeout=", absl::GetFlag(FLAGS_stall_timeout))});
  }
  if (!ok) {
    StopAll(children);
    return 1;
  }

  // Healthy once the router sees every worker.
  httplib::Client client(host, port);
  client.set_connection_timeout(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::string model_id;
  for (;;) {
    if (std::string gone; Exited(children, &gone) != nullptr) {
      std::cerr << "sluice up: " << gone << " while starting; stopping the others\n";
      StopAll(children);
      return 1;
    }
    auto health = client.Get("/v1/workers");
    if (health && health->status == 200) {
      const std::string& body = health->body;
      const size_t down = body.find("\"state\":\"down\"");
      if (down == std::string::npos) {
        if (auto models = client.Get("/v1/models"); models && models->status == 200) {
          const size_t at = models->body.find("\"id\":\"");
          if (at != std::string::npos) {
            model_id = models->body.substr(at + 6, models->body.find('"', at + 6) - at - 6);
          }
        }
        break;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "sluice up: the cluster did not become healthy within 120 s; stopping it\n";
      StopAll(children);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string url = absl::StrFormat("http://%s:%d", host, port);
  std::cout << absl::StrFormat(
      "\nsluice is up: %s  (%d prefill, %d decode, KV preset %s, model %s)\n\n"
      "  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": "
      "\"What is the capital of France?\"}], \"stream\": true}'\n\n"
      "  ./sluice status --port %d      workers, sequences, KV pages\n"
      "  metrics: %s/metrics (router), %s\n\n"
      "Ctrl-C stops every process.\n",
      url, n_prefill, n_decode, absl::GetFlag(FLAGS_preset), model_id, url, model_id, port, url,
      absl::StrJoin(metrics, ", "));
  std::cout.flush();

  // Supervise until a signal: a process that exits is started again with the same flags after a
  // backoff, and rejoins (the router's channels reconnect to the same port; the router itself
  // comes back on its port). The others keep serving meanwhile.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec tick = {0, 200 * 1000 * 1000};
  for (;;) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::cerr << "\nsluice up: stopping\n";
      StopAll(children);
      std::cerr << "sluice up: every process stopped\n";
      return 0;
    }
    const auto now = std::chrono::steady_clock::now();
    std::string gone;
    while (Child* c = Exited(children, &gone)) {
      if (now - c->started_at > std::chrono::minutes(1)) c->backoff = std::chrono::seconds(1);
      c->restart_at = now + c->backoff;
      std::cerr << "sluice up: " << gone << "; starting it again in " << c->backoff.count()
                << " s\n";
      c->backoff = std::min<std::chrono::seconds>(2 * c->backoff, std::chrono::seconds(30));
    }
    for (Child& c : children) {
      if (c.pid != 0 || c.restart_at > now) continue;
      c.pid = Spawn(c.argv);
      c.started_at = now;
      if (c.pid < 0) {
        c.pid = 0;
        c.restart_at = now + c.backoff;
        std::cerr << "sluice up: cannot start " << c.name << " again; trying later\n";
      } else {
        std::cerr << "sluice up: " << c.name << " started again (pid " << c.pid << ")\n";
      }
    }
  }
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  sluice::BlockShutdownSignals();
  absl::ParseCommandLine(argc, argv);
  return sluice::Run(argv[0]);
}
