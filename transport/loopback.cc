// LoopbackTransport: regions live in one process-wide table keyed by a number; a descriptor is
// "loopback:<number>" and a Put is a memcpy into the region, so a Flush has nothing to wait for.
// Every Put looks its region up again: a Put into a region destroyed since Connect returns
// Unavailable (the in-process picture of a peer that died) instead of writing freed memory.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace sluice::transport {
namespace {

constexpr absl::string_view kPrefix = "loopback:";

struct RegionEntry {
  uint8_t* base;
  size_t bytes;
};

// The process-wide table of exposed regions.
class RegionTable {
 public:
  static RegionTable& Get() {
    static RegionTable* table = new RegionTable;  // never destroyed: used until exit
    return *table;
  }

  uint64_t Add(uint8_t* base, size_t bytes) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    regions_[id] = {base, bytes};
    return id;
  }

  void Remove(uint64_t id) {
    absl::MutexLock lock(&mu_);
    regions_.erase(id);
  }

  // Runs fn(entry) under the table's lock so the region cannot go away meanwhile; false when
  // no region has this id.
  template <class Fn>
  bool With(uint64_t id, Fn fn) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) return false;
    fn(it->second);
    return true;
  }

 private:
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, RegionEntry> regions_ ABSL_GUARDED_BY(mu_);
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using OwnedMemory = std::unique_ptr<uint8_t, FreeDeleter>;

class LoopbackRegion final : public ExposedRegion {
 public:
  LoopbackRegion(uint8_t* base, size_t bytes, OwnedMemory owned)
      : owned_(std::move(owned)),
        base_(base),
        bytes_(bytes),
        id_(RegionTable::Get().Add(base, bytes)),
        descriptor_(absl::StrCat(kPrefix, id_)) {}
  ~LoopbackRegion() override { RegionTable::Get().Remove(id_); }
  const std::string& descriptor() const override { return descriptor_; }
  void* base() const override { return base_; }
  size_t size() const override { return bytes_; }

 private:
  const OwnedMemory owned_;  // set by AllocateAndExpose
  uint8_t* const base_;
  const size_t bytes_;
  const uint64_t id_;
  const std::string descriptor_;
};

class LoopbackSender final : public Sender {
 public:
  LoopbackSender(uint64_t id, size_t bytes) : id_(id), region_bytes_(bytes) {}

  absl::Status Put(const void* src, size_t bytes, uint64_t offset) override {
    if (bytes > region_bytes_ || offset > region_bytes_ - bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("put of %u bytes at offset %u leaves loopback region %u of %u bytes",
                          bytes, offset, id_, region_bytes_));
    }
    if (bytes == 0) return absl::OkStatus();
    const bool found = RegionTable::Get().With(
        id_, [&](const RegionEntry& r) { std::memcpy(r.base + offset, src, bytes); });
    if (!found) {
      return absl::UnavailableError(
          absl::StrFormat("loopback region %u was destroyed after Connect", id_));
    }
    bytes_put_ += bytes;
    return absl::OkStatus();
  }

  absl::Status Flush(absl::Duration) override {
    if (!RegionTable::Get().With(id_, [](const RegionEntry&) {})) {
      return absl::UnavailableError(
          absl::StrFormat("loopback region %u was destroyed after Connect", id_));
    }
    return absl::OkStatus();
  }

  uint64_t bytes_put() const override { return bytes_put_; }

 private:
  const uint64_t id_;
  const size_t region_bytes_;
  uint64_t bytes_put_ = 0;
};

class LoopbackTransport final : public Transport {
 public:
  std::string_view name() const override { return "loopback"; }

  absl::StatusOr<std::unique_ptr<ExposedRegion>> Expose(void* base, size_t bytes) override {
    if (base == nullptr || bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot expose %u bytes at %p: need a non-null base and at least one "
                          "byte",
                          bytes, base));
    }
    return std::make_unique<LoopbackRegion>(static_cast<uint8_t*>(base), bytes, nullptr);
  }

  absl::StatusOr<std::unique_ptr<ExposedRegion>> AllocateAndExpose(size_t bytes) override {
    if (bytes == 0 || bytes > (size_t{1} << 48)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot allocate a region of %u bytes", bytes));
    }
    OwnedMemory memory(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot allocate a loopback region of %u bytes", bytes));
    }
    uint8_t* base = memory.get();
    return std::make_unique<LoopbackRegion>(base, bytes, std::move(memory));
  }

  absl::Status RegisterSource(const void* base, size_t bytes) override {
    if (base == nullptr || bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cannot register %u bytes at %p as a source: need a non-null base and at least one byte",
          bytes, base));
    }
    return absl::OkStatus();  // memcpy reads any memory
  }

  absl::StatusOr<std::unique_ptr<Sender>> Connect(std::string_view descriptor) override {
    const absl::string_view d(descriptor.data(), descriptor.size());
    uint64_t id = 0;
    if (!absl::StartsWith(d, kPrefix) || !absl::SimpleAtoi(d.substr(kPrefix.size()), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed loopback descriptor (want \"loopback:<id>\"): \"",
                       absl::CHexEscape(d.substr(0, 64)), d.size() > 64 ? "...\"" : "\""));
    }
    size_t bytes = 0;
    if (!RegionTable::Get().With(id, [&](const RegionEntry& r) { bytes = r.bytes; })) {
      return absl::NotFoundError(
          absl::StrFormat("loopback region %u is not exposed (never was, or was destroyed)", id));
    }
    return std::make_unique<LoopbackSender>(id, bytes);
  }
};

}  // namespace

std::unique_ptr<Transport> CreateLoopbackTransport() {
  return std::make_unique<LoopbackTransport>();
}

}  // namespace sluice::transport
