// UcxTransport: UCX RMA puts into a peer's exposed region.
//
// Threading. Each transport owns one UCP context and one worker in UCS_THREAD_MODE_MULTI, and a
// progress thread. The progress thread sleeps on the worker's event fd (UCP_FEATURE_WAKEUP) and
// progresses the worker whenever something arrives: connection setup, and wherever UCX emulates
// the put with messages (TCP, shared memory into memory UCX did not allocate) the incoming
// data itself, which lands in the exposed memory only when the receiving worker is progressed.
// Senders post puts from the caller's thread and progress the worker themselves while they
// wait in Flush, so the hot path never waits for a thread switch. While a sender has done so
// within kSenderActiveNs, the progress thread stays out of the worker: two threads progressing
// one worker spend their time spinning on its lock (a fifth of the CPU of a TCP stream).
// Regions and senders hold the shared core; the core (thread, worker, context) goes away with
// the last of them.
//
// Endpoints. A transport keeps one endpoint per peer worker and every sender to that peer's
// regions shares it: a receiver that exposes a region per reservation costs a sender one rkey
// unpack per region, not a connection. An endpoint whose peer failed is dropped at the next
// Connect to that peer (which connects afresh); idle endpoints beyond kMaxIdleEndpoints go.
//
// Peer failure. A peer on another host is connected with UCP_ERR_HANDLING_MODE_PEER, and the
// endpoint's error handler marks the sender failed. UCX 1.13's shared-memory transports (posix,
// sysv) support no error handling mode but NONE, and PEER mode would exclude them, so a peer on
// this host (same boot id and pid namespace, both in the descriptor) is connected in mode NONE
// and watched through /proc instead: its pid must still run with the start time it had when it
// exposed the region. Flush checks that when it starts and every kLivenessInterval while it
// waits.
//
// Descriptor (host byte order; sender and receiver run on the same architecture):
//   DescriptorHeader  [worker address]  [packed rkey]  u64 FNV-1a of everything before it
// The parser checks every length and the checksum before any byte reaches UCX, which trusts
// addresses and rkeys blindly.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "transport/transport.h"

namespace sluice::transport {
namespace {

// Endpoints kept to peers no sender uses at the moment.
constexpr size_t kMaxIdleEndpoints = 64;
// How long Connect waits for the connection to the peer to come up.
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);
// How long a sender's destructor waits for its endpoint to close.
constexpr absl::Duration kCloseTimeout = absl::Seconds(2);
// How often a waiting Flush looks at a same-host peer's process.
constexpr absl::Duration kLivenessInterval = absl::Milliseconds(20);
// The progress thread wakes at least this often even without events: UCX's keepalive and
// timers advance only inside ucp_worker_progress.
constexpr int kIdleWakeMs = 50;
// The progress thread leaves the worker to a sender that progressed it this recently.
constexpr int64_t kSenderActiveNs = 2'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusCode CodeFor(ucs_status_t st) {
  switch (st) {
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::StatusCode::kInvalidArgument;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::StatusCode::kResourceExhausted;
    case UCS_ERR_TIMED_OUT:
      return absl::StatusCode::kDeadlineExceeded;
    case UCS_ERR_UNSUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_CANCELED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_BUSY:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status UcsError(ucs_status_t st, absl::string_view what, const char* file, int line) {
  return absl::Status(CodeFor(st),
                      absl::StrCat(what, ": ", ucs_status_string(st), " (", file, ":", line, ")"));
}
#define SLUICE_UCS_ERROR(st, what) UcsError((st), (what), __FILE__, __LINE__)

absl::Status ErrnoError(absl::string_view what, const char* file, int line) {
  return absl::InternalError(
      absl::StrCat(what, ": ", std::strerror(errno), " (", file, ":", line, ")"));
}
#define SLUICE_ERRNO_ERROR(what) ErrnoError((what), __FILE__, __LINE__)

// ---- descriptor ----

// ---- process identity, for same-host peers ----

struct ProcessId {
  uint64_t host;         // boot id and pid namespace; equal means pids are comparable
  uint64_t start_ticks;  // start time, clock ticks after boot: tells a reused pid apart
  uint32_t pid;
};

uint64_t Fnv1a(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string ReadSmallFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// State and start time of process `pid` from /proc/<pid>/stat; false if it does not exist.
bool ReadProcessStat(uint32_t pid, char* state, uint64_t* start_ticks) {
  const std::string stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
  // "pid (comm) state ppid ..."; comm may hold spaces and parentheses, so parse after the last
  // ')'. The start time is field 22, the 20th after the state.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 20 || fields[0].size() != 1) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_ticks);
}

// This process. Not cached: a child forked after the first call has a pid of its own.
ProcessId Self() {
  static const uint64_t host = [] {
    struct stat ns = {};
    const uint64_t ns_inode = stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
    return Fnv1a(ReadSmallFile("/proc/sys/kernel/random/boot_id"),
                 ns_inode * 0x9e3779b97f4a7c15ull + 1);
  }();
  ProcessId p = {.host = host, .start_ticks = 0, .pid = static_cast<uint32_t>(getpid())};
  char state;
  if (!ReadProcessStat(p.pid, &state, &p.start_ticks)) p.start_ticks = 0;
  return p;
}

// False once the process is gone: no such pid, a zombie, or a new process under the old pid.
bool StillRunning(const ProcessId& p) {
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcessStat(p.pid, &state, &start)) return false;
  return state != 'Z' && state != 'X' && start == p.start_ticks;
}

// ---- descriptor ----

constexpr uint32_t kMagic = 0x58554c53;  // "SLUX" in little-endian memory order
constexpr uint16_t kVersion = 1;
// Worker addresses are a few hundred bytes, rkeys less; anything beyond this is corrupt.
constexpr uint32_t kMaxPartBytes = 1 << 20;

struct DescriptorHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;  // zero
  uint64_t base;      // the region in the receiver's address space
  uint64_t length;
  uint64_t host;  // ProcessId of the receiver
  uint64_t start_ticks;
  uint32_t pid;
  uint32_t address_bytes;  // the receiver's worker address
  uint32_t rkey_bytes;     // the region's packed rkey
  uint32_t padding;        // zero
};
static_assert(sizeof(DescriptorHeader) == 56);

std::string EncodeDescriptor(std::string_view address, std::string_view rkey, uint64_t base,
                             uint64_t length) {
  const ProcessId self = Self();
  const DescriptorHeader h = {.magic = kMagic,
                              .version = kVersion,
                              .reserved = 0,
                              .base = base,
                              .length = length,
                              .host = self.host,
                              .start_ticks = self.start_ticks,
                              .pid = self.pid,
                              .address_bytes = static_cast<uint32_t>(address.size()),
                              .rkey_bytes = static_cast<uint32_t>(rkey.size()),
                              .padding = 0};
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(address);
  out.append(rkey);
  const uint64_t sum = Fnv1a(out);
  out.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  return out;
}

struct ParsedDescriptor {
  uint64_t base;
  uint64_t length;
  ProcessId process;
  std::string address;  // copies: UCX reads them through aligned pointers
  std::string rkey;
};

absl::StatusOr<ParsedDescriptor> ParseDescriptor(std::string_view d) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("malformed UCX region descriptor (%u bytes): %s", d.size(), why));
  };
  DescriptorHeader h;
  if (d.size() < sizeof(h) + sizeof(uint64_t)) return bad("shorter than its fixed header");
  std::memcpy(&h, d.data(), sizeof(h));
  if (h.magic != kMagic) return bad("wrong magic number");
  if (h.version != kVersion) {
    return bad(absl::StrFormat("version %u, this build reads version %u", h.version, kVersion));
  }
  if (h.reserved != 0 || h.padding != 0) return bad("reserved fields are not zero");
  if (h.address_bytes == 0 || h.address_bytes > kMaxPartBytes) {
    return bad(absl::StrFormat("worker address of %u bytes", h.address_bytes));
  }
  if (h.rkey_bytes == 0 || h.rkey_bytes > kMaxPartBytes) {
    return bad(absl::StrFormat("rkey of %u bytes", h.rkey_bytes));
  }
  const size_t want = sizeof(h) + h.address_bytes + h.rkey_bytes + sizeof(uint64_t);
  if (d.size() != want) {
    return bad(absl::StrFormat("its lengths add up to %u bytes", want));
  }
  uint64_t sum;
  std::memcpy(&sum, d.data() + want - sizeof(sum), sizeof(sum));
  if (sum != Fnv1a(d.substr(0, want - sizeof(sum)))) return bad("checksum mismatch");
  if (h.length == 0 || h.base + h.length < h.base) {
    return bad(absl::StrFormat("region [%#x, +%u) is empty or wraps around", h.base, h.length));
  }
  ParsedDescriptor p;
  p.base = h.base;
  p.length = h.length;
  p.process = {.host = h.host, .start_ticks = h.start_ticks, .pid = h.pid};
  p.address.assign(d.substr(sizeof(h), h.address_bytes));
  p.rkey.assign(d.substr(sizeof(h) + h.address_bytes, h.rkey_bytes));
  return p;
}

// ---- the shared core: context, worker, progress thread ----

// Whether the peer behind one endpoint has failed. UCX's error handler marks it from whichever
// thread progresses the worker; for a same-host peer, Failed() also looks at its process.
class PeerState {
 public:
  explicit PeerState(const ProcessId& process)
      : process_(process), same_host_(process.host == Self().host) {}

  bool same_host() const { return same_host_; }

  void MarkFailed(ucs_status_t st) {
    status_.store(st, std::memory_order_relaxed);
    failed_.store(true, std::memory_order_release);
  }

  // Only UCX's verdict: one atomic load, for the put path.
  bool known_failed() const { return failed_.load(std::memory_order_acquire); }

  // UCX's verdict, and for a same-host peer whether its process still runs (read from /proc;
  // `force` reads it now, otherwise at most every kLivenessInterval).
  bool Failed(bool force) {
    if (known_failed()) return true;
    if (!same_host_) return false;
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (!force && now - last_check_ < kLivenessInterval) return false;
    last_check_ = now;
    if (StillRunning(process_)) return false;
    exited_ = true;
    MarkFailed(UCS_ERR_CONNECTION_RESET);
    return true;
  }

  std::string Describe() const {
    absl::MutexLock lock(&mu_);
    if (exited_) return absl::StrFormat("process %u on this host exited", process_.pid);
    return ucs_status_string(status_.load(std::memory_order_relaxed));
  }

 private:
  const ProcessId process_;
  const bool same_host_;
  std::atomic<bool> failed_{false};
  std::atomic<ucs_status_t> status_{UCS_OK};
  mutable absl::Mutex mu_;  // senders sharing an endpoint may ask at once
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
};

void OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<PeerState*>(arg)->MarkFailed(status);
}

class UcxCore {
 public:
  static absl::StatusOr<std::shared_ptr<UcxCore>> Create(const UcxOptions& options);
  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;
  ~UcxCore();

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address() const { return address_; }

  // A registered source: [begin, end) and its memory handle. Sources stay registered until the
  // core is destroyed, so a sender may keep one it found.
  struct SourceRange {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    ucp_mem_h memh = nullptr;
    bool Holds(uintptr_t a, size_t bytes) const { return a >= begin && a + bytes <= end; }
  };

  absl::Status RegisterSource(const void* base, size_t bytes);
  // The registered source holding [p, p + bytes); memh is nullptr if there is none.
  SourceRange FindSource(uintptr_t p, size_t bytes) const;

  // Progresses the worker until `request` completes (then frees it), `deadline` passes or
  // `peer` (when given) fails. nullptr and error pointers are handled, so the result of any
  // *_nbx call can be passed straight in.
  absl::Status Wait(ucs_status_ptr_t request, absl::Time deadline, PeerState* peer,
                    absl::string_view what);

  // Called by senders just before they progress the worker from their own thread.
  void NoteSenderActive() { last_sender_ns_.store(NowNs(), std::memory_order_relaxed); }

  // Keeps an endpoint's error-handler state alive until the worker is destroyed, for endpoints
  // whose close did not complete (UCX may still call their handler).
  void Retire(std::shared_ptr<PeerState> state) {
    absl::MutexLock lock(&mu_);
    retired_.push_back(std::move(state));
  }

 private:
  UcxCore() = default;
  void ProgressLoop();

  struct Source {
    size_t bytes;
    ucp_mem_h memh;
  };

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> last_sender_ns_{std::numeric_limits<int64_t>::min() / 2};
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::map<uintptr_t, Source> sources_ ABSL_GUARDED_BY(mu_);  // by base address
  std::vector<std::shared_ptr<PeerState>> retired_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<UcxCore>> UcxCore::Create(const UcxOptions& options) {
  // The destructor releases whatever was set up when a step below fails.
  std::shared_ptr<UcxCore> core(new UcxCore());

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return SLUICE_UCS_ERROR(st, "ucp_config_read");
  if (!options.transports.empty()) {
    st = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat(
          "UCX rejects the transport list \"", options.transports, "\": ", ucs_status_string(st)));
    }
  }
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &core->context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    core->context_ = nullptr;
    return SLUICE_UCS_ERROR(st, absl::StrCat("ucp_init with UCX_TLS=\"", options.transports, "\""));
  }

  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(core->context_, &wparams, &core->worker_);
  if (st != UCS_OK) {
    core->worker_ = nullptr;
    return SLUICE_UCS_ERROR(st, "ucp_worker_create");
  }
  ucp_worker_attr_t wattr = {};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  st = ucp_worker_query(core->worker_, &wattr);
  if (st != UCS_OK) return SLUICE_UCS_ERROR(st, "ucp_worker_query");
  if (wattr.thread_mode != UCS_THREAD_MODE_MULTI) {
    return absl::UnimplementedError(
        "this UCX library was built without multi-threaded worker support (--enable-mt)");
  }

  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  st = ucp_worker_get_address(core->worker_, &address, &address_bytes);
  if (st != UCS_OK) return SLUICE_UCS_ERROR(st, "ucp_worker_get_address");
  core->address_.assign(reinterpret_cast<const char*>(address), address_bytes);
  ucp_worker_release_address(core->worker_, address);

  int worker_fd = -1;
  st = ucp_worker_get_efd(core->worker_, &worker_fd);
  if (st != UCS_OK) return SLUICE_UCS_ERROR(st, "ucp_worker_get_efd");
  core->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (core->epoll_fd_ < 0) return SLUICE_ERRNO_ERROR("epoll_create1");
  core->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (core->stop_fd_ < 0) return SLUICE_ERRNO_ERROR("eventfd");
  for (const int fd : {worker_fd, core->stop_fd_}) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(core->epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return SLUICE_ERRNO_ERROR("epoll_ctl(EPOLL_CTL_ADD)");
    }
  }
  core->thread_ = std::thread([c = core.get()] { c->ProgressLoop(); });
  return core;
}

UcxCore::~UcxCore() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) {
      PLOG(WARNING) << "waking the UCX progress thread";  // it still wakes within kIdleWakeMs
    }
    thread_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  {
    absl::MutexLock lock(&mu_);
    for (auto& [base, source] : sources_) {
      const ucs_status_t st = ucp_mem_unmap(context_, source.memh);
      LOG_IF(WARNING, st != UCS_OK) << "ucp_mem_unmap of a source: " << ucs_status_string(st);
    }
    sources_.clear();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxCore::ProgressLoop() {
  epoll_event events[2];
  while (!stop_.load(std::memory_order_acquire)) {
    const int64_t since_sender = NowNs() - last_sender_ns_.load(std::memory_order_relaxed);
    if (since_sender < kSenderActiveNs) {
      // A sender is progressing the worker itself; wait on the stop fd alone until it has been
      // quiet for kSenderActiveNs.
      pollfd stop = {.fd = stop_fd_, .events = POLLIN, .revents = 0};
      poll(&stop, 1, static_cast<int>((kSenderActiveNs - since_sender) / 1'000'000 + 1));
      continue;
    }
    while (ucp_worker_progress(worker_) != 0) {
    }
    const ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    // Armed: sleep until the worker's fd or the stop fd fires. If arming failed, the timeout
    // turns this into a slow poll rather than a stall.
    epoll_wait(epoll_fd_, events, 2, kIdleWakeMs);
  }
}

absl::Status UcxCore::RegisterSource(const void* base, size_t bytes) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot register %u bytes at %p as a source: need a non-null base and at least one byte",
        bytes, base));
  }
  const uintptr_t key = reinterpret_cast<uintptr_t>(base);
  {
    absl::ReaderMutexLock lock(&mu_);
    if (sources_.count(key) != 0) {
      return absl::AlreadyExistsError(
          absl::StrFormat("a source at %p is already registered", base));
    }
  }
  ucp_mem_map_params_t mp = {};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(base);
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  const ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
  if (st != UCS_OK) {
    return SLUICE_UCS_ERROR(st, absl::StrFormat("ucp_mem_map of source [%p, +%u)", base, bytes));
  }
  absl::MutexLock lock(&mu_);
  sources_[key] = {bytes, memh};
  return absl::OkStatus();
}

UcxCore::SourceRange UcxCore::FindSource(uintptr_t p, size_t bytes) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sources_.upper_bound(p);
  if (it == sources_.begin()) return {};
  --it;
  const SourceRange r = {it->first, it->first + it->second.bytes, it->second.memh};
  return r.Holds(p, bytes) ? r : SourceRange{};
}

absl::Status UcxCore::Wait(ucs_status_ptr_t request, absl::Time deadline, PeerState* peer,
                           absl::string_view what) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return SLUICE_UCS_ERROR(UCS_PTR_STATUS(request), what);
  ucs_status_t st;
  for (int spins = 0;; ++spins) {
    st = ucp_request_check_status(request);
    if (st != UCS_INPROGRESS) break;
    if (peer != nullptr && peer->known_failed()) {
      st = UCS_ERR_CONNECTION_RESET;
      break;
    }
    // Reading the clock costs more than a progress call that finds nothing to do.
    if (spins % 64 == 0) {
      NoteSenderActive();
      if (spins > 0 && peer != nullptr && peer->Failed(/*force=*/false)) continue;
      if (spins > 0 && absl::Now() > deadline) {
        ucp_request_free(request);  // UCX releases it when it completes
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": not complete by the deadline (peer alive but slow, or hung)"));
      }
    }
    ucp_worker_progress(worker_);
  }
  ucp_request_free(request);
  if (st == UCS_OK) return absl::OkStatus();
  return SLUICE_UCS_ERROR(st, what);
}

// ---- regions and senders ----

class UcxRegion final : public ExposedRegion {
 public:
  UcxRegion(std::shared_ptr<UcxCore> core, ucp_mem_h memh, void* base, size_t bytes,
            std::string descriptor)
      : core_(std::move(core)),
        memh_(memh),
        base_(base),
        bytes_(bytes),
        descriptor_(std::move(descriptor)) {}
  ~UcxRegion() override {
    const ucs_status_t st = ucp_mem_unmap(core_->context(), memh_);
    LOG_IF(WARNING, st != UCS_OK) << "ucp_mem_unmap of an exposed region: "
                                  << ucs_status_string(st);
  }
  const std::string& descriptor() const override { return descriptor_; }
  void* base() const override { return base_; }
  size_t size() const override { return bytes_; }

 private:
  const std::shared_ptr<UcxCore> core_;
  const ucp_mem_h memh_;  // unmapping frees the memory if UCX allocated it
  void* const base_;
  const size_t bytes_;
  const std::string descriptor_;
};

// Closes `ep`, waiting at most kCloseTimeout; FORCE skips the goodbye to a peer known dead.
// False when the close did not complete in time.
bool CloseEndpoint(UcxCore& core, ucp_ep_h ep, bool force) {
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  const absl::Status st =
      core.Wait(ucp_ep_close_nbx(ep, &p), absl::Now() + kCloseTimeout, nullptr, "ucp_ep_close_nbx");
  // An error (the peer died meanwhile) still closes the endpoint; only a timeout leaves it open.
  return !absl::IsDeadlineExceeded(st);
}

// One endpoint to one peer worker, shared by the senders to its regions; closed with the last.
class UcxEndpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxCore> core, std::shared_ptr<PeerState> peer, ucp_ep_h ep)
      : core_(std::move(core)), peer_(std::move(peer)), ep_(ep) {}
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;
  ~UcxEndpoint() {
    if (!CloseEndpoint(*core_, ep_, /*force=*/peer_->Failed(/*force=*/true))) {
      LOG(WARNING) << "closing a UCX endpoint timed out after " << kCloseTimeout
                   << "; it is released with the worker";
      core_->Retire(peer_);
    }
  }
  ucp_ep_h ep() const { return ep_; }
  PeerState& peer() const { return *peer_; }

 private:
  const std::shared_ptr<UcxCore> core_;
  const std::shared_ptr<PeerState> peer_;  // UCX's error handler writes it
  const ucp_ep_h ep_;
};

class UcxSender final : public Sender {
 public:
  UcxSender(std::shared_ptr<UcxCore> core, std::shared_ptr<UcxEndpoint> endpoint, ucp_rkey_h rkey,
            uint64_t base, uint64_t length)
      : core_(std::move(core)),
        endpoint_(std::move(endpoint)),
        peer_(&endpoint_->peer()),
        ep_(endpoint_->ep()),
        rkey_(rkey),
        base_(base),
        length_(length) {}

  ~UcxSender() override { ucp_rkey_destroy(rkey_); }
  absl::Status Put(const void* src, size_t bytes, uint64_t offset) override {
    if (bytes > length_ || offset > length_ - bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("put of %u bytes at offset %u leaves the peer's region of %u bytes",
                          bytes, offset, length_));
    }
    if (peer_->known_failed()) return PeerFailed();
    if (bytes == 0) return absl::OkStatus();
    ucp_request_param_t p = {};
    const uintptr_t a = reinterpret_cast<uintptr_t>(src);
    if (!source_.Holds(a, bytes)) {
      if (UcxCore::SourceRange r = core_->FindSource(a, bytes); r.memh != nullptr) source_ = r;
    }
    if (source_.Holds(a, bytes)) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      p.memh = source_.memh;
    }
    const ucs_status_ptr_t r = ucp_put_nbx(ep_, src, bytes, base_ + offset, rkey_, &p);
    if (UCS_PTR_IS_ERR(r)) {
      if (peer_->Failed(/*force=*/true)) return PeerFailed();
      return SLUICE_UCS_ERROR(UCS_PTR_STATUS(r), "ucp_put_nbx");
    }
    if (r != nullptr) {
      // Completion is observed through Flush; the request goes back to UCX when it completes.
      ucp_request_free(r);
      // Let queued sends advance while the caller prepares the next put.
      core_->NoteSenderActive();
      ucp_worker_progress(core_->worker());
    }
    bytes_put_ += bytes;
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Duration timeout) override {
    if (peer_->Failed(/*force=*/true)) return PeerFailed();
    ucp_request_param_t p = {};
    const absl::Status st =
        core_->Wait(ucp_ep_flush_nbx(ep_, &p), absl::Now() + timeout, peer_, "ucp_ep_flush_nbx");
    if (peer_->Failed(/*force=*/!st.ok())) return PeerFailed();
    return st;
  }

  uint64_t bytes_put() const override { return bytes_put_; }

 private:
  absl::Status PeerFailed() const {
    return absl::UnavailableError(absl::StrFormat(
        "the peer exposing region %#x (%u bytes) failed: %s", base_, length_, peer_->Describe()));
  }

  const std::shared_ptr<UcxCore> core_;
  const std::shared_ptr<UcxEndpoint> endpoint_;
  PeerState* const peer_;  // the endpoint's
  const ucp_ep_h ep_;
  const ucp_rkey_h rkey_;
  const uint64_t base_;
  const uint64_t length_;
  UcxCore::SourceRange source_;  // the registered source the last put came from
  uint64_t bytes_put_ = 0;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxCore> core) : core_(std::move(core)) {}

  std::string_view name() const override { return "ucx"; }

  absl::StatusOr<std::unique_ptr<ExposedRegion>> Expose(void* base, size_t bytes) override {
    if (base == nullptr || bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot expose %u bytes at %p: need a non-null base and at least one byte", bytes, base));
    }
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = bytes;
    ucp_mem_h memh = nullptr;
    const ucs_status_t st = ucp_mem_map(core_->context(), &mp, &memh);
    if (st != UCS_OK) {
      return SLUICE_UCS_ERROR(st, absl::StrFormat("ucp_mem_map of region [%p, +%u)", base, bytes));
    }
    return MakeRegion(memh, base, bytes);
  }

  absl::StatusOr<std::unique_ptr<ExposedRegion>> AllocateAndExpose(size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("cannot allocate a region of 0 bytes");
    // UCX allocates from the first method that works (UCX_ALLOC_PRIO: shared memory first).
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = bytes;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(core_->context(), &mp, &memh);
    if (st != UCS_OK) {
      return SLUICE_UCS_ERROR(st, absl::StrFormat("ucp_mem_map allocating %u bytes", bytes));
    }
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK) {
      ucp_mem_unmap(core_->context(), memh);
      return SLUICE_UCS_ERROR(st, "ucp_mem_query");
    }
    if (reinterpret_cast<uintptr_t>(attr.address) % 64 != 0) {
      ucp_mem_unmap(core_->context(), memh);
      return absl::InternalError(
          absl::StrFormat("UCX allocated a region at %p, not 64-byte aligned", attr.address));
    }
    return MakeRegion(memh, attr.address, bytes);
  }

  absl::Status RegisterSource(const void* base, size_t bytes) override {
    return core_->RegisterSource(base, bytes);
  }

  absl::StatusOr<std::unique_ptr<Sender>> Connect(std::string_view descriptor) override {
    absl::StatusOr<ParsedDescriptor> d = ParseDescriptor(descriptor);
    if (!d.ok()) return d.status();
    const bool same_host = d->process.host == Self().host;
    auto unreachable = [&](absl::string_view why) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot reach the peer (process %u%s) exposing region %#x: %s", d->process.pid,
          same_host ? " on this host" : " on another host", d->base, why));
    };
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<UcxEndpoint>> endpoint = EndpointTo(*d);
    if (!endpoint.ok()) return unreachable(endpoint.status().message());
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack((*endpoint)->ep(), d->rkey.data(), &rkey);
    if (st != UCS_OK)
      return unreachable(absl::StrCat("ucp_ep_rkey_unpack: ", ucs_status_string(st)));
    return std::make_unique<UcxSender>(core_, *std::move(endpoint), rkey, d->base, d->length);
  }

 private:
  // The endpoint to the worker `d` names: the one kept for it while its peer has not failed,
  // else a new one, connected before it is returned (so an unreachable peer shows up here
  // rather than on Flush).
  absl::StatusOr<std::shared_ptr<UcxEndpoint>> EndpointTo(const ParsedDescriptor& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = endpoints_.find(d.address); it != endpoints_.end()) {
      if (!it->second->peer().Failed(/*force=*/true)) return it->second;
      endpoints_.erase(it);
    }
    auto peer = std::make_shared<PeerState>(d.process);
    if (peer->Failed(/*force=*/true)) return absl::UnavailableError("the process is not running");
    ucp_ep_params_t ep_params = {};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(d.address.data());
    // See the top of this file: PEER would rule out shared memory on this host.
    ep_params.err_mode =
        peer->same_host() ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = OnPeerError;
    ep_params.err_handler.arg = peer.get();
    ucp_ep_h ep = nullptr;
    const ucs_status_t st = ucp_ep_create(core_->worker(), &ep_params, &ep);
    if (st != UCS_OK) {
      return absl::UnavailableError(
          absl::StrCat("ucp_ep_create: ", ucs_status_string(st),
                       " (do both sides allow a common transport in UCX_TLS?)"));
    }
    auto endpoint = std::make_shared<UcxEndpoint>(core_, peer, ep);
    ucp_request_param_t p = {};
    absl::Status connected = core_->Wait(ucp_ep_flush_nbx(ep, &p), absl::Now() + kConnectTimeout,
                                         peer.get(), "ucp_ep_flush_nbx");
    if (peer->Failed(/*force=*/true)) connected = absl::UnavailableError(peer->Describe());
    if (!connected.ok()) return connected;  // the endpoint closes, forced, as it goes
    for (auto it = endpoints_.begin();
         endpoints_.size() >= kMaxIdleEndpoints && it != endpoints_.end();) {
      it = it->second.use_count() == 1 ? endpoints_.erase(it) : std::next(it);
    }
    endpoints_[d.address] = endpoint;
    return endpoint;
  }

  // Packs the rkey of mapped memory into a descriptor; unmaps the memory on failure.
  absl::StatusOr<std::unique_ptr<ExposedRegion>> MakeRegion(ucp_mem_h memh, void* base,
                                                            size_t bytes) {
    void* rkey = nullptr;
    size_t rkey_bytes = 0;
    const ucs_status_t st = ucp_rkey_pack(core_->context(), memh, &rkey, &rkey_bytes);
    if (st != UCS_OK) {
      ucp_mem_unmap(core_->context(), memh);
      return SLUICE_UCS_ERROR(st, "ucp_rkey_pack");
    }
    std::string descriptor = EncodeDescriptor(
        core_->address(), std::string_view(static_cast<const char*>(rkey), rkey_bytes),
        reinterpret_cast<uint64_t>(base), bytes);
    ucp_rkey_buffer_release(rkey);
    return std::make_unique<UcxRegion>(core_, memh, base, bytes, std::move(descriptor));
  }

  const std::shared_ptr<UcxCore> core_;
  absl::Mutex mu_;
  // By the peer worker's address.
  std::map<std::string, std::shared_ptr<UcxEndpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxOptions& options) {
  absl::StatusOr<std::shared_ptr<UcxCore>> core = UcxCore::Create(options);
  if (!core.ok()) return core.status();
  return std::make_unique<UcxTransport>(*std::move(core));
}

}  // namespace sluice::transport
