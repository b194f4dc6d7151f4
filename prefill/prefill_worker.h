// The prefill worker: runs prompts through the model in chunks, compresses their KV into pages
// as the preset says (prompt-phase policy, quantization, Huffman coding, all inside the cache),
// samples the first token, and writes the pages and the sequence's state into the window a
// decode worker exposed for the reservation, over the transport. With a transform-coded wire
// (--wire_bits and --kv_calibration; presets that keep every token), the prompt's rows are
// coded as each chunk computes them and one stream crosses instead of pages and state.
//
// One scheduler thread owns the model and the caches. It takes waiting prompts first come,
// first served, and runs up to `step_tokens` prompt tokens a step, a chunk of up to
// `chunk_tokens` from each of one prompt or several (chunked prefill). A prompt is cut every
// `chunk_tokens` from its start whatever runs beside it, and its matmuls run as a prompt's
// (model::StepKind::kPrompt), so its KV and first token are the same bits however it was batched
// (on the host backends). In a prompt's last chunk each layer's pages go to a sender thread as soon
// as the layer is done (PagedKvCache::StreamLayers), so they travel while the next layers compute;
// presets whose pages change after a commit send everything once the prompt is done. The sender
// flushes while the scheduler computes the next prompts, then hands the sequence back to the
// scheduler to free its pages.
//
// Prefix caching: after each chunk's commit the scheduler forks the prompt's sequence into a
// snapshot (PagedKvCache::ForkSequence: full pages shared, the open pages and the window
// copied) recorded in the preset's PrefixIndex under the tokens it holds. A later prompt with
// the same first blocks forks the longest snapshot and computes only the tokens after it;
// since a prompt is cut at the same places whatever ran before, it computes the same bits as
// without the cache. A prompt whose first blocks another started prompt is computing (the
// chat turns of several conversations over one system prompt, arriving together) waits until
// their snapshot is there. Snapshots are evicted least recently used first, beyond
// `prefix_cache_entries` and whenever a step or a fork needs pages they hold. Presets that
// select from the whole prompt (snapkv, pyramid, minikv) and prompts that cross
// transform-coded (every row goes into the coded stream) are never cached.
#ifndef SLUICE_PREFILL_PREFILL_WORKER_H_
#define SLUICE_PREFILL_PREFILL_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/worker_runtime.h"
#include "kvstore/cache/prefix_index.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/sluice.pb.h"
#include "transport/transport.h"

namespace sluice::prefill {

struct PrefillWorkerOptions {
  std::string name = "prefill-0";
  // A prompt is cut every chunk_tokens from its start (a chunk a step), and its prefixes are
  // cached in chunks; a step runs chunks of several prompts up to step_tokens (at least one
  // chunk).
  int64_t chunk_tokens = 512;
  int64_t step_tokens = 512;
  absl::Duration transfer_timeout = absl::Seconds(10);
  // Prompt prefixes kept for reuse, each chunk_tokens long more than the last; 0: no cache.
  int64_t prefix_cache_entries = 64;
};

class PrefillWorker {
 public:
  // `runtime`, `transport` and `registry` must outlive the worker. Starts its threads.
  PrefillWorker(WorkerRuntime& runtime, transport::Transport& transport,
                prometheus::Registry& registry, PrefillWorkerOptions options);
  ~PrefillWorker();  // waiting requests fail with Unavailable

  // Queues the prompt and waits until its pages sit in the decode worker's reservation.
  absl::StatusOr<rpc::PrefillResponse> Prefill(const rpc::PrefillRequest& request);
  rpc::StatsResponse Stats();
  // Takes no new request (true) or takes them again (false).
  void Drain(bool on = true) { draining_ = on; }
  // Drops every cached prefix and returns their pages to the pools (those a running prompt
  // forked stay with it); waits for the scheduler (call it while the worker runs). Returns the
  // entries dropped.
  int64_t DropPrefixCache();

 private:
  struct Job {
    rpc::PrefillRequest request;
    std::promise<absl::StatusOr<rpc::PrefillResponse>> done;
    WorkerRuntime::Cache* cache = nullptr;
    int64_t seq = 0;
    int64_t next = 0;    // prompt tokens already run (or forked from a cached prefix)
    int64_t cached = 0;  // prompt tokens forked from a cached prefix
    absl::Time start;
    absl::Duration compute;
    rpc::PrefillResponse response;
    int64_t streamed = 0;  // pages handed to the sender by layer, in export order
    bool coded = false;    // its KV crosses transform-coded (the cache's wire), not as pages
    // Sender thread only: the connection to the reservation's window, the transfer so far.
    std::unique_ptr<transport::Sender> sender;
    absl::Status send_error;
    absl::Time send_start = absl::InfinitePast();
    int64_t sent_bytes = 0;
  };
  using JobPtr = std::shared_ptr<Job>;
  // Work for the sender thread, in order: a layer's pages (`last` false), or the rest of a
  // job's pages with its state, then the flush and the answer (`last` true). `error`: the job
  // failed; send nothing more and hand it back.
  struct Send {
    JobPtr job;
    std::vector<kvstore::PageId> pages;
    int64_t first = 0;  // index of pages[0] in export order (and in the window)
    bool last = false;
    std::string state;  // or, `coded`, the transform-coded stream, put at the window's start
    bool coded = false;
    absl::Status error;
  };

  void Loop();
  // Runs one chunk step over the jobs at the head of the queue.
  void Step();
  // A job whose prompt is done: first token, export, hand to the sender.
  void Complete(JobPtr job, absl::Span<const float> logits);
  // Answers with `error` and frees the job's pages (after the sender is done with them).
  void Fail(JobPtr job, absl::Status error);
  void Enqueue(Send send);
  void SendLoop();
  // Puts a send's pages into the reservation; the last one also flushes.
  absl::Status SendPages(Send& send);
  void Post(std::function<void()> task);
  void UpdateGauges();
  // The preset's prefix index; null where prefixes are not cached.
  kvstore::PrefixIndex* PrefixesFor(WorkerRuntime::Cache& c);
  // Starts the job's sequence: forked from the longest cached prefix, else empty.
  absl::Status StartSequence(Job& job, WorkerRuntime::Cache& c);
  // Whether a started job in `jobs` is computing whole blocks this job starts with that are not
  // cached yet: the job then waits for their snapshot rather than compute them too (as SGLang
  // holds back a prompt whose prefix another in its batch computes).
  bool AwaitsSharedPrefix(const Job& job, WorkerRuntime::Cache& c,
                          std::initializer_list<const std::deque<JobPtr>*> jobs);
  // Caches the job's committed tokens as a prefix, where they end a chunk.
  void Snapshot(Job& job);
  // At most how many pages a fork copies: each list's open page in either tier.
  int64_t ForkCopyPages() const;
  // Evicts cached prefixes until the pool has `pages` free or none is left.
  void MakeRoom(WorkerRuntime::Cache& c, int64_t pages);
  void EvictPrefix(WorkerRuntime::Cache& c, kvstore::PrefixIndex& index);

  WorkerRuntime& rt_;
  transport::Transport& transport_;
  const PrefillWorkerOptions options_;
  std::atomic<bool> draining_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> tasks_;
  std::deque<JobPtr> waiting_;  // under mu_ until the scheduler takes them
  bool stop_ = false;
  rpc::StatsResponse stats_;

  // Scheduler thread only.
  std::deque<JobPtr> queue_;
  int64_t next_seq_ = 1;
  int64_t sending_ = 0;
  std::map<WorkerRuntime::Cache*, kvstore::PrefixIndex> prefixes_;
  bool prefixes_changed_ = false;       // since prefix_names_ and prefix_pages_ were counted
  std::vector<uint64_t> prefix_names_;  // every entry's PrefixBlockHashes name
  int64_t prefix_pages_ = 0;

  // Sender thread.
  std::mutex send_mu_;
  std::condition_variable send_cv_;
  std::deque<Send> sends_;
  bool send_stop_ = false;

  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& transfer_bytes_;
  prometheus::Counter& transfer_failures_;
  prometheus::Counter& streamed_pages_;
  // What crossed to decode workers by codec ("pages": pages and state; "kvtc": the
  // transform-coded stream), and the same prompts' KV as fp16.
  prometheus::Family<prometheus::Counter>& wire_bytes_;
  prometheus::Family<prometheus::Counter>& wire_fp16_bytes_;
  prometheus::Counter& wire_bytes_pages_;
  prometheus::Counter& wire_bytes_kvtc_;
  prometheus::Counter& wire_fp16_bytes_pages_;
  prometheus::Counter& wire_fp16_bytes_kvtc_;
  prometheus::Histogram& transfer_seconds_;
  prometheus::Histogram& prefill_seconds_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& running_gauge_;
  prometheus::Gauge& waiting_gauge_;
  prometheus::Gauge& queued_tokens_;
  prometheus::Gauge& pool_resident_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_query_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  prometheus::Counter& prefix_evictions_;
  prometheus::Gauge& prefix_entries_;
  prometheus::Counter& held_bytes_;

  std::thread thread_;
  std::thread sender_;
};

}  // namespace sluice::prefill

#endif  // SLUICE_PREFILL_PREFILL_WORKER_H_
