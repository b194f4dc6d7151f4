// Moving compressed KV pages between workers: one interface, two implementations.
//
// The receiving worker (decode) exposes a memory region per reservation, a window only that
// reservation's sender can reach, and hands the region's descriptor to senders over the control
// plane (gRPC). A sender (prefill) connects with that descriptor and writes page bytes into the
// region. Flush() returns once everything put so far sits in the receiver's memory; only then
// does the sender tell the receiver (over gRPC) that the pages are there, and the receiver
// checks each page's checksum, moves the pages into its pool and unexposes the window.
// Connecting to another region of a peer already connected reuses the connection.
//
//   UcxTransport       UCX RMA put with the region's packed rkey (shared memory, TCP, RDMA,
//                      whatever UCX picks; UCX_TLS narrows it), a progress thread per worker,
//                      peer-failure detection and timeouts.
//   LoopbackTransport  in-process memcpy, for unit tests.
//
// Memory the receiver allocates through AllocateAndExpose() is the fast case on one host: UCX
// maps it into the sender's process over shared memory, so a put is one memcpy by the sender.
// Memory exposed with Expose() is reached through UCX's emulated put there (the sender copies
// into a shared-memory queue, the receiver's progress thread copies out); over TCP both kinds
// go the same way, and RDMA writes either kind directly.
#ifndef SLUICE_TRANSPORT_TRANSPORT_H_
#define SLUICE_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::transport {

// A region of this process that peers may write into. Unexposed when destroyed.
class ExposedRegion {
 public:
  virtual ~ExposedRegion() = default;
  // Opaque bytes a sender needs to reach the region (for UCX: the worker's address, the packed
  // rkey, the base address and length). Travels over gRPC.
  virtual const std::string& descriptor() const = 0;
  // The exposed memory in this process.
  virtual void* base() const = 0;
  virtual size_t size() const = 0;
};

// One connection to one peer's exposed region. Calls come from one thread at a time.
class Sender {
 public:
  virtual ~Sender() = default;
  // Starts copying bytes [src, src + bytes) into the peer's region at `offset`. `src` must stay
  // unchanged until Flush() returns. Puts between two Flushes may land in any order, so they
  // should not overlap. InvalidArgument when [offset, offset + bytes) leaves the region;
  // Unavailable once the peer has failed.
  virtual absl::Status Put(const void* src, size_t bytes, uint64_t offset) = 0;
  // Waits until every Put so far has landed in the peer's memory. DeadlineExceeded after
  // `timeout`; Unavailable when the peer failed (its process died, the connection broke).
  virtual absl::Status Flush(absl::Duration timeout) = 0;
  // Bytes put through this connection so far.
  virtual uint64_t bytes_put() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  // Lets peers write into [base, base + bytes); the memory must outlive the returned region.
  virtual absl::StatusOr<std::unique_ptr<ExposedRegion>> Expose(void* base, size_t bytes) = 0;
  // Allocates `bytes` bytes (64-byte aligned, contents unspecified) that the returned region owns,
  // and exposes them as Expose() does. Preferred for a receiver's arena: see the top of this file.
  virtual absl::StatusOr<std::unique_ptr<ExposedRegion>> AllocateAndExpose(size_t bytes) = 0;
  // Registers memory that Puts will read from (a sender's own page arena), so large puts need
  // no bounce buffer. Optional: Put works on any memory. The memory must outlive the transport
  // and its senders and regions (UCX: AlreadyExists for a second registration at one base).
  virtual absl::Status RegisterSource(const void* base, size_t bytes) = 0;
  // Connects to the region a peer exposed. InvalidArgument for a malformed descriptor,
  // Unavailable when the peer cannot be reached (loopback: NotFound for a region that is not
  // exposed).
  virtual absl::StatusOr<std::unique_ptr<Sender>> Connect(std::string_view descriptor) = 0;
};

struct UcxOptions {
  // UCX_TLS-style transport list ("shm", "tcp", "sm,self", ...); empty: UCX's default choice.
  std::string transports;
};

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxOptions& options);

// Regions live in a process-wide table; descriptors name them. Senders and the region must be
// in the same process.
std::unique_ptr<Transport> CreateLoopbackTransport();

}  // namespace sluice::transport

#endif  // SLUICE_TRANSPORT_TRANSPORT_H_
