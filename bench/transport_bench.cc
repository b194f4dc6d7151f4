// Page streaming bandwidth of UcxTransport next to Debian's ucx_perftest (ucp_put_bw, the same
// RMA put), in the same run, per UCX transport (shared memory, TCP loopback) and message size.
// Prints a table on stderr and writes one JSON document (bench/results/transport-cpu.json
// through `./sluice bench transport`) to --out or stdout.
//
// Ours: the bench re-executes itself as the receiving process, which allocates and exposes a
// region (AllocateAndExpose, --region_bytes) and waits; this process connects, registers its
// source arena, and puts messages back to back, flushing every --flush_bytes and at the end.
// Bandwidth is bytes over the time from the first put to the end of the last flush; the median
// of --repeats runs is reported. Two access patterns:
//   same    every put reads the same source bytes and writes the same destination offset, as
//           ucx_perftest does (its buffers are one message long): the like-for-like comparison.
//   stream  puts walk through the whole source arena and region, as streaming KV pages does.
// Peer: ucx_perftest server and client on localhost with the same UCX_TLS, message size and
// message count per run; the client's "Final:" line gives the overall bandwidth (MB/s, where
// perftest's MB is 2^20 bytes).
//
// Handoff: what a reservation's pages cost from the sender's first put to the receiver having
// them in its pool, per --handoff_sizes bytes of 16 KiB pages, two ways (median of
// --handoff_repeats, control messages over the pipe to the receiver in both):
//   pool    puts straight into the receiver's one exposed pool region, flush, tell the receiver
//           (how pages travelled before reservations had windows: any sender could reach any
//           page of the pool)
//   window  the receiver exposes a window for the reservation (AllocateAndExpose); the sender
//           connects to it (the connection to the peer is reused: an rkey unpack), puts,
//           flushes; the receiver copies the window into its pool and unexposes it (what
//           serving does now)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/int_list.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "transport/transport.h"

ABSL_FLAG(std::string, sizes, "65536,262144,1048576,4194304", "Message sizes in bytes.");
ABSL_FLAG(std::string, transports, "shm,tcp",
          "UCX_TLS values to measure, comma-separated; write a multi-transport list with colons "
          "(sm:self means UCX_TLS=sm,self).");
ABSL_FLAG(int, repeats, 5, "Timed runs per case and side; the median is reported.");
ABSL_FLAG(double, run_seconds, 0.25,
          "Target length of one run; the message count per run is calibrated from it.");
ABSL_FLAG(int64_t, region_bytes, int64_t{64} << 20,
          "Bytes the receiver exposes (and the sender's source arena).");
ABSL_FLAG(int64_t, flush_bytes, int64_t{64} << 20, "Flush after this many bytes put.");
ABSL_FLAG(std::string, memory, "allocated",
          "The receiver's region: 'allocated' (AllocateAndExpose) or 'own' (Expose of memory "
          "the receiver allocated itself).");
ABSL_FLAG(std::string, perftest, "/usr/bin/ucx_perftest",
          "The ucx_perftest binary; empty: measure ours only.");
ABSL_FLAG(std::string, perftest_args, "",
          "Extra ucx_perftest arguments, space-separated (e.g. \"-O 8\" to cap its outstanding "
          "puts).");
ABSL_FLAG(int, port, 13510, "First TCP port for ucx_perftest's handshake (one per run).");
ABSL_FLAG(std::string, handoff_sizes, "262144,1048576,4194304,16777216",
          "Bytes of one reservation's pages for the handoff rows; empty: no handoff rows.");
ABSL_FLAG(int, handoff_repeats, 30, "Reservations per handoff case and way; the median is kept.");
ABSL_FLAG(std::string, out, "", "Write the JSON here instead of stdout.");
ABSL_FLAG(std::string, role, "", "Internal: 'receiver' runs the receiving side.");
ABSL_FLAG(std::string, tls, "", "Internal: the receiver's UCX_TLS.");

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The CPU's model name from /proc/cpuinfo, for the results file.
std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

absl::StatusOr<Buffer> AllocateTouched(size_t bytes) {
  Buffer b(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
  if (b == nullptr) return absl::ResourceExhaustedError(absl::StrCat("allocating ", bytes, " B"));
  for (size_t i = 0; i < bytes; ++i) b.get()[i] = static_cast<uint8_t>(i * 131);
  return b;
}

// ---- child processes ----

// A child process with its stdin and stdout on pipes to this one.
struct Child {
  pid_t pid = -1;
  int in = -1;   // the child's stdin
  int out = -1;  // the child's stdout

  ~Child() { Stop(); }

  // Closes the child's stdin and waits for it; its exit status, or -signal.
  int Stop() {
    if (in >= 0) close(in);
    in = -1;
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid) {
      pid = -1;
      if (out >= 0) close(out);
      out = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    return -1;
  }

  // Everything the child writes to stdout until it closes it.
  std::string ReadAll() {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = read(out, buf, sizeof(buf))) > 0) s.append(buf, n);
    return s;
  }

  std::string ReadLine() {
    std::string s;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') s.push_back(c);
    return s;
  }
};

// Starts `argv` with extra environment `env` ("NAME=value"); stderr is inherited, or dropped
// when `quiet`.
absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env, bool quiet) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    if (quiet) {
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, 2);
    }
    close(to_child[0]);
    close(to_child[1]);
    close(from_child[0]);
    close(from_child[1]);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "transport_bench: exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  auto child = std::make_unique<Child>();
  child->pid = pid;
  child->in = to_child[1];
  child->out = from_child[0];
  return child;
}

// ---- the receiving side (--role=receiver) ----

absl::Status RunReceiver() {
  SLUICE_ASSIGN_OR_RETURN(auto t,
                          transport::CreateUcxTransport({.transports = absl::GetFlag(FLAGS_tls)}));
  const size_t bytes = absl::GetFlag(FLAGS_region_bytes);
  Buffer own;
  std::unique_ptr<transport::ExposedRegion> region;
  if (absl::GetFlag(FLAGS_memory) == "own") {
    SLUICE_ASSIGN_OR_RETURN(own, AllocateTouched(bytes));
    SLUICE_ASSIGN_OR_RETURN(region, t->Expose(own.get(), bytes));
  } else {
    SLUICE_ASSIGN_OR_RETURN(region, t->AllocateAndExpose(bytes));
    std::memset(region->base(), 0, bytes);  // fault the pages in before the clock starts
  }
  const std::string hex = absl::BytesToHexString(
      absl::string_view(region->descriptor().data(), region->descriptor().size()));
  std::printf("%s\n", hex.c_str());
  std::fflush(stdout);
  // Handoff commands, one per line, until the sender closes our stdin:
  //   "window N"  expose a fresh window of N bytes; answer its descriptor (hex)
  //   "commit N"  copy the window's first N bytes into the pool region, unexpose the window;
  //               answer the microseconds that took
  //   "ping"      answer "ok"
  std::unique_ptr<transport::ExposedRegion> window;
  std::string line;
  char c;
  while (read(0, &c, 1) > 0) {
    if (c != '\n') {
      line.push_back(c);
      continue;
    }
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    line.clear();
    int64_t n = 0;
    if (words.size() == 2 && !absl::SimpleAtoi(words[1], &n)) n = -1;
    std::string answer = "ok";
    if (words[0] == "window" && n > 0) {
      SLUICE_ASSIGN_OR_RETURN(window, t->AllocateAndExpose(static_cast<size_t>(n)));
      answer = absl::BytesToHexString(window->descriptor());
    } else if (words[0] == "commit" && window != nullptr && n >= 0 &&
               static_cast<size_t>(n) <= std::min(window->size(), region->size())) {
      const auto t0 = Clock::now();
      std::memcpy(region->base(), window->base(), static_cast<size_t>(n));
      window.reset();
      answer = absl::StrCat(Seconds(t0, Clock::now()) * 1e6);
    } else if (words[0] != "ping") {
      return absl::InvalidArgumentError(absl::StrCat("receiver: bad command '", line, "'"));
    }
    std::printf("%s\n", answer.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// ---- ours ----

class OursSide {
 public:
  static absl::StatusOr<std::unique_ptr<OursSide>> Start(const std::string& tls) {
    auto side = std::unique_ptr<OursSide>(new OursSide());
    SLUICE_ASSIGN_OR_RETURN(
        side->receiver_, Spawn({"/proc/self/exe", "--role=receiver", absl::StrCat("--tls=", tls),
                                absl::StrCat("--region_bytes=", absl::GetFlag(FLAGS_region_bytes)),
                                absl::StrCat("--memory=", absl::GetFlag(FLAGS_memory))},
                               {}, /*quiet=*/false));
    const std::string hex = side->receiver_->ReadLine();
    if (hex.empty()) return absl::UnavailableError("the receiver process reported no descriptor");
    const std::string descriptor = absl::HexStringToBytes(hex);
    SLUICE_ASSIGN_OR_RETURN(side->transport_, transport::CreateUcxTransport({.transports = tls}));
    side->bytes_ = absl::GetFlag(FLAGS_region_bytes);
    SLUICE_ASSIGN_OR_RETURN(side->arena_, AllocateTouched(side->bytes_));
    SLUICE_RETURN_IF_ERROR(side->transport_->RegisterSource(side->arena_.get(), side->bytes_));
    SLUICE_ASSIGN_OR_RETURN(side->sender_, side->transport_->Connect(descriptor));
    return side;
  }

  ~OursSide() {
    sender_.reset();
    transport_.reset();
    if (receiver_ != nullptr) receiver_->Stop();
  }

  // Seconds to put `count` messages of `size` bytes and flush.
  absl::StatusOr<double> Run(size_t size, int64_t count, bool stream) {
    const size_t slots = bytes_ / size;
    const int64_t flush_every = std::max<int64_t>(1, absl::GetFlag(FLAGS_flush_bytes) / size);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t offset = stream ? (i % slots) * size : 0;
      SLUICE_RETURN_IF_ERROR(sender_->Put(arena_.get() + offset, size, offset));
      if ((i + 1) % flush_every == 0 || i + 1 == count) {
        SLUICE_RETURN_IF_ERROR(sender_->Flush(absl::Seconds(60)));
      }
    }
    return Seconds(t0, Clock::now());
  }

  struct Handoff {
    double total_us = 0;    // first command or put to the receiver's answer after the commit
    double expose_us = 0;   // window: asking for it until its descriptor arrived
    double connect_us = 0;  // window: Connect to it
    double put_us = 0;      // the puts and the flush
    double copy_us = 0;     // window: the receiver's copy into its pool and unexposing
  };

  // One reservation's `bytes` of kPage pages handed to the receiver, through its pool region
  // or a window of its own.
  absl::StatusOr<Handoff> HandOff(size_t bytes, bool window) {
    constexpr size_t kPage = 16384;
    Handoff h;
    const auto t0 = Clock::now();
    transport::Sender* sender = sender_.get();
    std::unique_ptr<transport::Sender> to_window;
    if (window) {
      SLUICE_ASSIGN_OR_RETURN(std::string hex, Ask(absl::StrCat("window ", bytes)));
      const auto t1 = Clock::now();
      h.expose_us = Seconds(t0, t1) * 1e6;
      SLUICE_ASSIGN_OR_RETURN(to_window, transport_->Connect(absl::HexStringToBytes(hex)));
      sender = to_window.get();
      h.connect_us = Seconds(t1, Clock::now()) * 1e6;
    }
    const auto t2 = Clock::now();
    for (size_t off = 0; off < bytes; off += kPage) {
      SLUICE_RETURN_IF_ERROR(sender->Put(arena_.get() + off, std::min(kPage, bytes - off), off));
    }
    SLUICE_RETURN_IF_ERROR(sender->Flush(absl::Seconds(60)));
    to_window.reset();
    h.put_us = Seconds(t2, Clock::now()) * 1e6;
    SLUICE_ASSIGN_OR_RETURN(std::string answer,
                            Ask(window ? absl::StrCat("commit ", bytes) : "ping"));
    if (window && !absl::SimpleAtod(answer, &h.copy_us)) {
      return absl::InternalError(absl::StrCat("receiver answered '", answer, "' to a commit"));
    }
    h.total_us = Seconds(t0, Clock::now()) * 1e6;
    return h;
  }

 private:
  OursSide() = default;

  // Sends one command line to the receiver and reads its answer.
  absl::StatusOr<std::string> Ask(const std::string& command) {
    const std::string line = command + "\n";
    if (write(receiver_->in, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return absl::UnavailableError(
          absl::StrCat("writing to the receiver: ", std::strerror(errno)));
    }
    std::string answer = receiver_->ReadLine();
    if (answer.empty()) return absl::UnavailableError("the receiver did not answer " + command);
    return answer;
  }
  std::unique_ptr<Child> receiver_;
  std::unique_ptr<transport::Transport> transport_;
  size_t bytes_ = 0;
  Buffer arena_;
  std::unique_ptr<transport::Sender> sender_;
};

// ---- ucx_perftest ----

// One ucx_perftest ucp_put_bw run: its overall bandwidth in bytes per second.
absl::StatusOr<double> PerftestOnce(const std::string& tls, size_t size, int64_t count, int port) {
  const std::string perftest = absl::GetFlag(FLAGS_perftest);
  const std::vector<std::string> env = {absl::StrCat("UCX_TLS=", tls)};
  std::vector<std::string> test = {
      "-t", "ucp_put_bw",        "-s", absl::StrCat(size),
      "-n", absl::StrCat(count), "-w", absl::StrCat(std::max<int64_t>(1, count / 10)),
      "-p", absl::StrCat(port)};
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_perftest_args), ' ', absl::SkipEmpty())) {
    test.emplace_back(a);
  }
  std::vector<std::string> server_argv = {perftest};
  server_argv.insert(server_argv.end(), test.begin(), test.end());
  SLUICE_ASSIGN_OR_RETURN(auto server, Spawn(server_argv, env, /*quiet=*/true));
  std::vector<std::string> client_argv = {perftest, "localhost"};
  client_argv.insert(client_argv.end(), test.begin(), test.end());
  std::string output;
  // The server needs a moment to listen; the client gives up at once if it is not there yet.
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt == 0 ? 50 : 100));
    SLUICE_ASSIGN_OR_RETURN(auto client, Spawn(client_argv, env, /*quiet=*/true));
    output = client->ReadAll();
    const int rc = client->Stop();
    if (rc == 0 && output.find("Final:") != std::string::npos) break;
  }
  server->Stop();
  // "Final:  iterations  p50  avg  overall (usec)  avg  overall (MB/s)  avg  overall (msg/s)"
  const size_t at = output.find("Final:");
  if (at == std::string::npos) {
    return absl::UnavailableError(absl::StrCat(perftest, " with UCX_TLS=", tls, " size ", size,
                                               " printed no Final: line; its output:\n", output));
  }
  const std::string line = output.substr(at, output.find('\n', at) - at);
  const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  double mb_per_s = 0;
  if (f.size() < 7 || !absl::SimpleAtod(f[6], &mb_per_s)) {
    return absl::InternalError(absl::StrCat("cannot parse ucx_perftest's line: ", line));
  }
  return mb_per_s * (1 << 20);
}

// ---- the comparison ----

absl::StatusOr<nlohmann::json> Measure(const std::string& tls, const std::vector<int>& sizes,
                                       int repeats, int* port) {
  nlohmann::json rows = nlohmann::json::array();
  SLUICE_ASSIGN_OR_RETURN(auto ours, OursSide::Start(tls));
  for (const int size : sizes) {
    if (absl::GetFlag(FLAGS_region_bytes) % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--region_bytes=%d is not a multiple of message size %d",
                          absl::GetFlag(FLAGS_region_bytes), size));
    }
    // Calibrate the message count on one streaming run (which also warms both sides up).
    const int64_t probe = std::max<int64_t>(16, (int64_t{256} << 20) / size);
    SLUICE_ASSIGN_OR_RETURN(double probe_s, ours->Run(size, probe, /*stream=*/true));
    const double bw = probe * size / probe_s;
    const int64_t count =
        std::max<int64_t>(64, static_cast<int64_t>(absl::GetFlag(FLAGS_run_seconds) * bw / size));

    std::vector<double> same, stream, peer;
    for (int r = 0; r < repeats; ++r) {
      SLUICE_ASSIGN_OR_RETURN(double s, ours->Run(size, count, /*stream=*/false));
      same.push_back(count * size / s);
      SLUICE_ASSIGN_OR_RETURN(s, ours->Run(size, count, /*stream=*/true));
      stream.push_back(count * size / s);
      if (!absl::GetFlag(FLAGS_perftest).empty()) {
        SLUICE_ASSIGN_OR_RETURN(double p, PerftestOnce(tls, size, count, (*port)++));
        peer.push_back(p);
      }
    }
    auto gbps = [](std::vector<double> v) {
      for (double& x : v) x /= 1e9;
      return v;
    };
    const double ours_same = Median(same) / 1e9, ours_stream = Median(stream) / 1e9;
    nlohmann::json row = {{"transport", tls},
                          {"message_bytes", size},
                          {"messages_per_run", count},
                          {"ours_gbps", ours_same},
                          {"ours_stream_gbps", ours_stream},
                          {"ours_runs_gbps", gbps(same)},
                          {"ours_stream_runs_gbps", gbps(stream)}};
    std::string peer_columns = absl::StrFormat("%15s %7s", "-", "-");
    if (!peer.empty()) {
      const double perftest = Median(peer) / 1e9;
      row["ucx_perftest_gbps"] = perftest;
      row["ucx_perftest_runs_gbps"] = gbps(peer);
      row["ratio"] = ours_same / perftest;
      row["ratio_stream"] = ours_stream / perftest;
      peer_columns = absl::StrFormat("%15.2f %7.2f", perftest, ours_same / perftest);
    }
    std::fprintf(stderr, "%-10s %9d %10lld %12.2f %14.2f %s\n", tls.c_str(), size,
                 static_cast<long long>(count), ours_same, ours_stream, peer_columns.c_str());
    rows.push_back(std::move(row));
  }
  return rows;
}

// The handoff rows of one UCX_TLS: pool and window, per size, alternating the two ways.
absl::StatusOr<nlohmann::json> MeasureHandoff(const std::string& tls,
                                              const std::vector<int>& sizes) {
  nlohmann::json rows = nlohmann::json::array();
  SLUICE_ASSIGN_OR_RETURN(auto ours, OursSide::Start(tls));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_handoff_repeats));
  for (const int size : sizes) {
    if (size <= 0 || size > absl::GetFlag(FLAGS_region_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("handoff size %d: must be in (0, --region_bytes=%d]", size,
                          absl::GetFlag(FLAGS_region_bytes)));
    }
    std::vector<OursSide::Handoff> pool, window;
    for (int r = 0; r < repeats + 2; ++r) {  // the first two of each warm up
      SLUICE_ASSIGN_OR_RETURN(OursSide::Handoff p, ours->HandOff(size, /*window=*/false));
      SLUICE_ASSIGN_OR_RETURN(OursSide::Handoff w, ours->HandOff(size, /*window=*/true));
      if (r < 2) continue;
      pool.push_back(p);
      window.push_back(w);
    }
    auto median = [](const std::vector<OursSide::Handoff>& v, double OursSide::Handoff::*f) {
      std::vector<double> x;
      for (const auto& h : v) x.push_back(h.*f);
      return Median(x);
    };
    using H = OursSide::Handoff;
    const double p = median(pool, &H::total_us), w = median(window, &H::total_us);
    nlohmann::json row = {{"transport", tls},
                          {"bytes", size},
                          {"pool_us", p},
                          {"window_us", w},
                          {"window_over_pool", w / p},
                          {"pool_put_us", median(pool, &H::put_us)},
                          {"window_expose_us", median(window, &H::expose_us)},
                          {"window_connect_us", median(window, &H::connect_us)},
                          {"window_put_us", median(window, &H::put_us)},
                          {"window_copy_us", median(window, &H::copy_us)}};
    std::fprintf(stderr, "%-10s %9d %10.0f %10.0f %7.2f %10.0f %10.0f %10.0f %10.0f\n", tls.c_str(),
                 size, p, w, w / p, row["window_expose_us"].get<double>(),
                 row["window_connect_us"].get<double>(), row["window_put_us"].get<double>(),
                 row["window_copy_us"].get<double>());
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::Status Run() {
  SLUICE_ASSIGN_OR_RETURN(std::vector<int> sizes, bench::ParseIntList(absl::GetFlag(FLAGS_sizes)));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::string memory = absl::GetFlag(FLAGS_memory);
  if (memory != "allocated" && memory != "own") {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory must be 'allocated' or 'own', not '", memory, "'"));
  }
  if (!absl::GetFlag(FLAGS_perftest).empty() &&
      access(absl::GetFlag(FLAGS_perftest).c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no ucx_perftest at ", absl::GetFlag(FLAGS_perftest),
                                            " (Debian package ucx-utils)"));
  }
  std::fprintf(stderr,
               "UCX %s; ours: UcxTransport, receiver memory '%s', %lld MiB region, flush every "
               "%lld MiB; peer: ucx_perftest ucp_put_bw; GB/s = 1e9 B/s, median of %d runs\n",
               ucp_get_version_string(), memory.c_str(),
               static_cast<long long>(absl::GetFlag(FLAGS_region_bytes) >> 20),
               static_cast<long long>(absl::GetFlag(FLAGS_flush_bytes) >> 20), repeats);
  std::fprintf(stderr, "%-10s %9s %10s %12s %14s %15s %7s\n", "UCX_TLS", "bytes", "msgs/run",
               "ours GB/s", "ours stream", "perftest GB/s", "ratio");
  nlohmann::json rows = nlohmann::json::array();
  int port = absl::GetFlag(FLAGS_port);
  for (const absl::string_view entry :
       absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty())) {
    const std::string tls = absl::StrReplaceAll(entry, {{":", ","}});
    SLUICE_ASSIGN_OR_RETURN(nlohmann::json r, Measure(tls, sizes, repeats, &port));
    for (auto& row : r) rows.push_back(row);
  }
  nlohmann::json handoff = nlohmann::json::array();
  if (!absl::GetFlag(FLAGS_handoff_sizes).empty()) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<int> handoff_sizes,
                            bench::ParseIntList(absl::GetFlag(FLAGS_handoff_sizes)));
    std::fprintf(stderr,
                 "\nhandoff of one reservation's pages (16 KiB puts), microseconds, median of %d\n"
                 "%-10s %9s %10s %10s %7s %10s %10s %10s %10s\n",
                 absl::GetFlag(FLAGS_handoff_repeats), "UCX_TLS", "bytes", "pool", "window",
                 "ratio", "expose", "connect", "put+flush", "copy");
    for (const absl::string_view entry :
         absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty())) {
      const std::string tls = absl::StrReplaceAll(entry, {{":", ","}});
      SLUICE_ASSIGN_OR_RETURN(nlohmann::json r, MeasureHandoff(tls, handoff_sizes));
      for (auto& row : r) handoff.push_back(row);
    }
  }
  const nlohmann::json out = {
      {"system", "sluice"},
      {"benchmark", "transport"},
      {"machine",
       {{"cpu", CpuModel()}, {"cores", static_cast<int>(std::thread::hardware_concurrency())}}},
      {"ucx_version", ucp_get_version_string()},
      {"receiver_memory", memory},
      {"ucx_perftest_args", absl::GetFlag(FLAGS_perftest_args)},
      {"region_bytes", absl::GetFlag(FLAGS_region_bytes)},
      {"flush_bytes", absl::GetFlag(FLAGS_flush_bytes)},
      {"repeats", repeats},
      {"gbps", "1e9 bytes per second"},
      {"rows", rows},
      {"handoff", handoff}};
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    std::cout << out.dump(1) << "\n";
  } else {
    std::ofstream f(path);
    f << out.dump(1) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const absl::Status st =
      absl::GetFlag(FLAGS_role) == "receiver" ? sluice::RunReceiver() : sluice::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "transport_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
