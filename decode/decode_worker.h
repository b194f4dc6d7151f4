// The decode worker: takes a sequence's compressed KV from a prefill worker (pages and the
// sequence's state, written into a window exposed for that reservation alone, then checked and
// moved into pages it reserved in its pool), runs every live
// sequence in one continuous batch (sequences join and leave at every step), applies the
// preset's generation-phase policy inside the cache, and streams tokens back.
//
// One scheduler thread owns the model, the caches and their pools; gRPC threads hand it work
// through a task queue and wait on futures or token streams.
//
//   Reserve   pages for a prompt's KV and a window to receive them, freed if Generate does not
//             come within the expiry; a client (the peer's host) holds a bounded share of the
//             pool in reservations, and only it may renew, release or use them
//   Generate  moves the window's pages into the pool, imports the KV (checking every page's
//             checksum) and joins the batch
//   Cancel    (the client went away) removes the sequence at the next step: its pages go back
//             to the pool at once
#ifndef SLUICE_DECODE_DECODE_WORKER_H_
#define SLUICE_DECODE_DECODE_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/worker_runtime.h"
#include "kvstore/cache/prefix_index.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "model/sampler.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/sluice.pb.h"

namespace sluice::decode {

// Tokens of one generation, from the scheduler thread to the gRPC thread streaming them.
class TokenStream {
 public:
  void Push(rpc::GeneratedToken token);
  // The last call: `reason` is "stop", "length" or "abort"; `error` not OK on failure.
  void Finish(std::string reason, absl::Status error = absl::OkStatus());
  // Waits up to `wait` for tokens or the end; moves what arrived into *tokens. True once the
  // stream has ended and everything was taken (then *reason / *error are set).
  bool Take(std::vector<rpc::GeneratedToken>* tokens, std::string* reason, absl::Status* error,
            absl::Duration wait);
  // The stream as Decode.Generate's messages (the gRPC service and in-process readers): waits up
  // to `wait`, then fills *message with the tokens that arrived and, once the stream ended well,
  // its finish reason. False when there is nothing to send yet. *done once the stream ended;
  // *error is then how (a failed stream's last message may hold no token).
  bool NextMessage(rpc::GenerateResponse* message, bool* done, absl::Status* error,
                   absl::Duration wait);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::GeneratedToken> tokens_;
  bool done_ = false;
  std::string reason_;
  absl::Status error_;
};

struct DecodeWorkerOptions {
  std::string name = "decode-0";
  int max_batch = 64;                                  // sequences in one forward step
  absl::Duration reservation_ttl = absl::Seconds(60);  // unused reservations are freed after
  // What one client may hold in reservations at once (its first is always admitted):
  double max_client_reserved_fraction = 0.5;  // of the pool's pages
  int max_client_reservations = 1024;
  // Prompt prefixes whose pages the worker keeps after importing them, for later prompts that
  // begin the same way (their prefill worker then sends only the other pages); least recently
  // used first out, and whenever a reservation needs their pages. 0: none kept.
  int held_prefix_entries = 64;
};

class DecodeWorker {
 public:
  // `runtime` and `registry` must outlive the worker. Starts the scheduler thread.
  DecodeWorker(WorkerRuntime& runtime, prometheus::Registry& registry, DecodeWorkerOptions options);
  ~DecodeWorker();  // stops the thread; live sequences end with "abort"

  // `client` names the caller (common/grpc_auth.h's PeerHost; empty in-process): reservations
  // are bounded per client, and another client's reservation reads as unknown (NotFound).
  // ResourceExhausted when the pool or the client's bound has no room for the request.
  absl::StatusOr<rpc::ReserveResponse> Reserve(const rpc::ReserveRequest& request,
                                               const std::string& client = "");
  // Restarts the expiry of a reservation; NotFound once it has expired or been used.
  absl::StatusOr<rpc::RenewResponse> Renew(uint64_t reservation_id, const std::string& client = "");
  absl::Status Release(uint64_t reservation_id, const std::string& client = "");
  // Imports the request's KV from its reservation's window and adds the sequence to the batch.
  absl::StatusOr<std::shared_ptr<TokenStream>> Generate(const rpc::GenerateRequest& request,
                                                        const std::string& client = "");
  // Ends the generation feeding `stream` and frees its pages.
  void Cancel(const std::shared_ptr<TokenStream>& stream);
  rpc::StatsResponse Stats();
  // Lets go of every held prefix (their pages go back to the pools once nothing else uses
  // them); waits for the scheduler. Returns the prefixes let go.
  int64_t DropHeldPrefixes();
  // Takes no new request (true) or takes them again (false).
  void Drain(bool on = true) { draining_ = on; }
  bool draining() const { return draining_; }

 private:
  struct Reservation {
    std::string preset;
    std::string client;
    std::vector<kvstore::PageId> pages;  // pool pages the window's pages move into
    // Exposed for this reservation alone: pages.size() pages, then state_bytes for the state.
    std::unique_ptr<transport::ExposedRegion> window;
    int64_t state_bytes = 0;
    absl::Time expires;
    // Generations forked from the prompt (ReserveRequest.choices). With more than one, the
    // first Generate imports the prompt as `parent`, a sequence outside the batch holding
    // `parent_pages` pages, and each choice forks it; the parent goes once every choice began.
    int choices = 1;
    uint64_t parent = 0;
    int64_t parent_pages = 0;
    int64_t room = 0;         // prompt + max_tokens, set at the import
    int64_t fork_pages = 0;   // what each choice may take beyond the prompt's pages
    std::vector<bool> begun;  // by choice
    // The held prefix offered (ReserveResponse.held): per run, its leading pages, one
    // reference each kept by the reservation until it ends.
    std::vector<std::vector<kvstore::PageId>> held;
  };
  // Prefixes of imported prompts whose pages stay: one index per cache and block size; each
  // entry (a prefix of whole blocks) holds, per run, the leading pages final once that prefix
  // was computed (PrefixMarks), one reference each, and their CRC32Cs.
  struct HeldEntry {
    std::vector<std::vector<kvstore::PageId>> pages;
    std::vector<uint32_t> crcs;
  };
  struct HeldPrefixes {
    explicit HeldPrefixes(int64_t block) : index(block) {}
    kvstore::PrefixIndex index;  // an entry's "sequence" is its HeldEntry's id
    std::map<int64_t, HeldEntry> entries;
  };
  struct Running {
    uint64_t request_id = 0;
    int64_t seq = 0;
    WorkerRuntime::Cache* cache = nullptr;
    model::SamplingParams params;
    std::unique_ptr<model::Sampler> sampler;
    std::vector<int32_t> history;  // prompt and generated tokens
    int32_t last = 0;              // the token the next step feeds
    // A replayed generation's tokens (GenerateRequest.replay), fed before any is sampled.
    std::vector<int32_t> replay;
    size_t replayed = 0;
    int generated = 0;
    int64_t room = 0;  // prompt + max_tokens
    bool logprobs = false;
    int top_logprobs = 0;
    std::shared_ptr<TokenStream> stream;
    absl::Time last_token_time;
  };

  // Runs `fn` on the scheduler thread and waits for its result.
  template <typename T>
  T OnScheduler(std::function<T()> fn);
  void Loop();
  void Step();
  void StepGroup(WorkerRuntime::Cache* cache, std::vector<Running*>& group);
  // Removes `r` from the batch and its cache, ending its stream.
  void Finish(uint64_t seq, const std::string& reason, absl::Status error = absl::OkStatus());
  // The KV state a prefill worker wrote into r's window after the pages, as `request`
  // announces it (size, CRC32C). InvalidArgument for a size the window cannot hold, DataLoss
  // for a checksum that does not match.
  absl::StatusOr<std::string> TakeState(const Reservation& r, const rpc::GenerateRequest& request);
  // A transform-coded prompt: the codec known and the calibration this worker loaded.
  absl::Status CheckWire(const rpc::GenerateRequest& request) const;
  // A transform-coded prompt's rows as its stream decodes: keys with RoPE and values, per layer.
  struct DecodedPrompt {
    kvstore::KvWireShape shape;
    std::vector<std::vector<float>> k, v;  // [layers][tokens * kv_heads * head_dim]
  };
  // The transform-coded prompt of `request`, decoded on the calling thread (a request's, one
  // prompt at a time) rather than the scheduler's, which keeps stepping its batch meanwhile:
  // the stream is copied out of the reservation's window on the scheduler, checked, then
  // decoded here. Null when the reservation imported its prompt already (a later choice).
  // On error the reservation is freed, as an import failure.
  absl::StatusOr<std::unique_ptr<DecodedPrompt>> DecodeWire(const rpc::GenerateRequest& request,
                                                            const std::string& client);
  // Commits the decoded rows into the cache as sequence `seq`, in the preset's format, letting
  // each layer's rows go as the cache takes them; nothing of `seq` is left on error.
  absl::Status ImportWire(WorkerRuntime::Cache& cache, uint64_t seq, int64_t room, int64_t prompt,
                          DecodedPrompt& decoded);
  // Moves what the prefill worker put into `r`'s window into the cache as sequence `seq` (of
  // `room` tokens): the KV state checked against the request's checksum, the pages moved into
  // the reservation's and checked, or a transform-coded stream decoded. The reservation's pages
  // not imported go back to the pool and its window is unexposed; on error nothing of `seq` is
  // left (the caller frees the reservation).
  absl::Status ImportReserved(Reservation& r, const rpc::GenerateRequest& request,
                              WorkerRuntime::Cache* cache, uint64_t seq, int64_t room,
                              DecodedPrompt* decoded);
  // One choice of a reservation with several: imports the prompt as the parent at the first
  // call, forks the choice's sequence from it, and lets the parent go after the last choice.
  absl::StatusOr<std::shared_ptr<TokenStream>> GenerateChoice(
      std::map<uint64_t, Reservation>::iterator it, const rpc::GenerateRequest& request,
      WorkerRuntime::Cache* cache, int64_t room, DecodedPrompt* decoded);
  // The imported sequence `seq` starts generating (the scheduler's part of Generate).
  absl::StatusOr<std::shared_ptr<TokenStream>> StartRunning(const rpc::GenerateRequest& request,
                                                            WorkerRuntime::Cache* cache,
                                                            uint64_t seq, int64_t room);
  // The reservation `id` if `client` holds it; NotFound otherwise.
  absl::StatusOr<std::map<uint64_t, Reservation>::iterator> FindReservation(
      uint64_t id, const std::string& client);
  // ResourceExhausted when reserving `pages` more of `cache`'s pool would take `client` past
  // its bound.
  absl::Status CheckClientBound(const std::string& client, const WorkerRuntime::Cache& cache,
                                int64_t pages) const;
  void ExpireReservations();
  void FreeReservation(std::map<uint64_t, Reservation>::iterator it);
  // The longest prefix of `prompt` whose pages `cache` holds; its pages retained for `r` and
  // described in *offer. Nothing when none is held.
  void OfferHeld(WorkerRuntime::Cache* cache, absl::Span<const int32_t> prompt, Reservation& r,
                 rpc::HeldPrefix* offer);
  // Keeps the pages of the imported prompt `seq` that `marks` names, one entry per block (those
  // held already stay as they are); marks that do not fit the sequence are ignored.
  void HoldPrefixes(WorkerRuntime::Cache* cache, int64_t seq, absl::Span<const int32_t> prompt,
                    const rpc::PrefixMarks& marks);
  // Lets go of the least recently used held prefix of `cache`; false when none is held.
  bool EvictHeld(const WorkerRuntime::Cache* cache);
  // Lets go of every held prefix (shutdown, DropHeldPrefixes); returns how many.
  int64_t DropAllHeld();
  // Pages of `cache` that only held prefixes keep: free once they are let go.
  int64_t HeldOnlyPages(const WorkerRuntime::Cache* cache) const;
  void UpdateGauges();
  // Pages that the running sequences may still need to reach their room.
  int64_t GrowthPages(const WorkerRuntime::Cache* cache) const;

  WorkerRuntime& rt_;
  const DecodeWorkerOptions options_;
  std::atomic<bool> draining_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> tasks_;
  bool stop_ = false;
  // Held while a transform-coded prompt decodes (DecodeWire): one at a time, so that the rows
  // of one prompt at most are held beside the pool.
  std::mutex decode_mu_;

  // Scheduler thread only.
  std::map<uint64_t, Reservation> reservations_;
  std::map<uint64_t, Running> running_;  // by sequence id
  uint64_t next_id_ = 1;                 // sequence ids
  // Reservation ids are random, so that a client cannot name another's by counting.
  absl::BitGen id_bits_;
  rpc::StatsResponse stats_;  // refreshed by UpdateGauges, read under mu_
  absl::Time gauges_at_ = absl::InfinitePast();
  std::map<std::pair<const WorkerRuntime::Cache*, int64_t>, HeldPrefixes> held_;
  int64_t next_held_ = 1;      // held entry ids
  bool held_changed_ = false;  // since the stats last named the held prefixes

  // Metrics.
  prometheus::Family<prometheus::Gauge>& pages_used_;
  prometheus::Family<prometheus::Gauge>& pages_free_;
  prometheus::Family<prometheus::Gauge>& compression_;
  prometheus::Family<prometheus::Gauge>& fragmentation_;
  prometheus::Family<prometheus::Gauge>& pages_total_;
  prometheus::Family<prometheus::Gauge>& page_bytes_;
  prometheus::Family<prometheus::Counter>& compaction_seconds_;
  std::map<std::string, double> compaction_seen_;  // by preset: seconds already counted
  prometheus::Gauge& pages_reserved_;
  prometheus::Gauge& pool_resident_;
  prometheus::Gauge& running_gauge_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& reservations_expired_;
  prometheus::Counter& import_failures_;
  prometheus::Counter& client_bound_refusals_;
  prometheus::Histogram& step_seconds_;
  prometheus::Histogram& wire_decode_seconds_;
  prometheus::Histogram& batch_size_;
  prometheus::Counter& held_offered_tokens_;
  prometheus::Counter& held_evictions_;
  prometheus::Gauge& held_entries_;
  prometheus::Gauge& held_pages_;

  std::thread thread_;
};

}  // namespace sluice::decode

#endif  // SLUICE_DECODE_DECODE_WORKER_H_
