#include "prefill/prefill_worker.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/sampling.h"
#include "common/status_macros.h"
#include "kvstore/cache/paged_kv_cache.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/kv_wire_codec.h"
#include "model/sampler.h"

namespace sluice::prefill {
namespace {

const std::vector<double> kSecondsBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

}  // namespace

PrefillWorker::PrefillWorker(WorkerRuntime& runtime, transport::Transport& transport,
                             prometheus::Registry& registry, PrefillWorkerOptions options)
    : rt_(runtime),
      transport_(transport),
      options_(std::move(options)),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("sluice_prefill_tokens_total")
                         .Help("Prompt tokens prefilled.")
                         .Register(registry)
                         .Add({})),
      transfer_bytes_(prometheus::BuildCounter()
                          .Name("sluice_kv_transfer_bytes_total")
                          .Help("KV page bytes put into decode workers' pools.")
                          .Register(registry)
                          .Add({})),
      transfer_failures_(prometheus::BuildCounter()
                             .Name("sluice_kv_transfer_failures_total")
                             .Help("KV transfers that failed (peer gone, timeout, bad target).")
                             .Register(registry)
                             .Add({})),
      streamed_pages_(prometheus::BuildCounter()
                          .Name("sluice_kv_transfer_streamed_pages_total")
                          .Help("KV pages sent while the prompt's later layers still computed.")
                          .Register(registry)
                          .Add({})),
      wire_bytes_(prometheus::BuildCounter()
                      .Name("sluice_kv_wire_bytes_total")
                      .Help("Bytes of prompts' KV sent to decode workers, by codec.")
                      .Register(registry)),
      wire_fp16_bytes_(prometheus::BuildCounter()
                           .Name("sluice_kv_wire_fp16_bytes_total")
                           .Help("The same prompts' KV as fp16, by the codec it crossed in.")
                           .Register(registry)),
      wire_bytes_pages_(wire_bytes_.Add({{"codec", "pages"}})),
      wire_bytes_kvtc_(wire_bytes_.Add({{"codec", "kvtc"}})),
      wire_fp16_bytes_pages_(wire_fp16_bytes_.Add({{"codec", "pages"}})),
      wire_fp16_bytes_kvtc_(wire_fp16_bytes_.Add({{"codec", "kvtc"}})),
      transfer_seconds_(prometheus::BuildHistogram()
                            .Name("sluice_kv_transfer_seconds")
                            .Help("Time to put one sequence's pages and flush them.")
                            .Register(registry)
                            .Add({}, kSecondsBuckets)),
      prefill_seconds_(prometheus::BuildHistogram()
                           .Name("sluice_prefill_seconds")
                           .Help("Forward time of one prompt, summed over its chunks (each "
                                 "step it ran in counted whole: what the prompt waited).")
                           .Register(registry)
                           .Add({}, kSecondsBuckets)),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("sluice_prefill_step_seconds")
                        .Help("Forward time of one prefill step (the chunks of every prompt in "
                              "it): prompt tokens over its sum are the worker's tokens/s.")
                        .Register(registry)
                        .Add({}, kSecondsBuckets)),
      running_gauge_(prometheus::BuildGauge()
                         .Name("sluice_requests_running")
                         .Help("Prompts being prefilled or sent.")
                         .Register(registry)
                         .Add({{"role", "prefill"}})),
      waiting_gauge_(prometheus::BuildGauge()
                         .Name("sluice_requests_waiting")
                         .Help("Prompts waiting for their first chunk.")
                         .Register(registry)
                         .Add({{"role", "prefill"}})),
      queued_tokens_(prometheus::BuildGauge()
                         .Name("sluice_prefill_queued_tokens")
                         .Help("Prompt tokens not yet run.")
                         .Register(registry)
                         .Add({})),
      pool_resident_(PoolResidentGauge(registry)),
      prefix_queries_(prometheus::BuildCounter()
                          .Name("sluice_prefix_cache_queries_total")
                          .Help("Prompts looked up in the prefix cache.")
                          .Register(registry)
                          .Add({})),
      prefix_query_tokens_(prometheus::BuildCounter()
                               .Name("sluice_prefix_cache_query_tokens_total")
                               .Help("Prompt tokens of the prompts looked up.")
                               .Register(registry)
                               .Add({})),
      prefix_hit_tokens_(prometheus::BuildCounter()
                             .Name("sluice_prefix_cache_hit_tokens_total")
                             .Help("Prompt tokens forked from a cached prefix, not computed.")
                             .Register(registry)
                             .Add({})),
      prefix_evictions_(prometheus::BuildCounter()
                            .Name("sluice_prefix_cache_evictions_total")
                            .Help("Cached prefixes evicted (least recently used first).")
                            .Register(registry)
                            .Add({})),
      prefix_entries_(prometheus::BuildGauge()
                          .Name("sluice_prefix_cache_entries")
                          .Help("Cached prompt prefixes, each a chunk longer than its parent.")
                          .Register(registry)
                          .Add({})),
      held_bytes_(prometheus::BuildCounter()
                      .Name("sluice_prefix_cache_bytes_not_sent_total")
                      .Help("KV page bytes not sent: the decode worker held them already.")
                      .Register(registry)
                      .Add({})) {
  stats_.set_name(options_.name);
  stats_.set_role("prefill");
  stats_.set_backend(rt_.backend_name());
  stats_.set_state("serving");
  thread_ = std::thread([this] { Loop(); });
  sender_ = std::thread([this] { SendLoop(); });
}

PrefillWorker::~PrefillWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PrefillWorker::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

absl::StatusOr<rpc::PrefillResponse> PrefillWorker::Prefill(const rpc::PrefillRequest& request) {
  if (draining_) return absl::UnavailableError(options_.name + " is draining");
  const model::LlamaConfig& c = rt_.config();
  if (request.prompt().empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (request.prompt_size() > c.context_length) {
    return absl::OutOfRangeError(absl::StrFormat("the prompt's %d tokens exceed the context of %d",
                                                 request.prompt_size(), c.context_length));
  }
  for (int32_t t : request.prompt()) {
    if (t < 0 || t >= c.vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt token %d is outside the vocabulary [0, %d)", t, c.vocab));
    }
  }
  if (request.pages() <= 0 || request.state_bytes() <= 0 || request.page_bytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the request's window holds pages=%d of page_bytes=%d and state_bytes=%d; each must be "
        "> 0",
        request.pages(), request.page_bytes(), request.state_bytes()));
  }
  SLUICE_RETURN_IF_ERROR(CheckedSampling(request.sampling()).status());
  SLUICE_RETURN_IF_ERROR(CheckedChoices(request.choices()).status());
  int64_t held = 0;
  for (int32_t n : request.held().pages()) {
    if (n < 0) return absl::InvalidArgumentError("held prefix: a run holds fewer than 0 pages");
    held += n;
  }
  if (request.held().crc32c_size() != held) {
    return absl::InvalidArgumentError(absl::StrFormat("held prefix: %d checksums for %d pages",
                                                      request.held().crc32c_size(), held));
  }
  auto job = std::make_shared<Job>();
  job->request = request;
  job->start = absl::Now();
  std::future<absl::StatusOr<rpc::PrefillResponse>> result = job->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError(options_.name + " is shutting down");
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
  return result.get();
}

void PrefillWorker::Loop() {
  for (;;) {
    std::vector<std::function<void()>> tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (tasks_.empty() && waiting_.empty() && queue_.empty() && !stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
      }
      tasks.swap(tasks_);
      while (!waiting_.empty()) {
        queue_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      if (stop_) break;
    }
    for (auto& task : tasks) task();
    if (!queue_.empty()) Step();
    UpdateGauges();
  }
  while (!queue_.empty()) {
    JobPtr job = std::move(queue_.front());
    queue_.pop_front();
    Fail(std::move(job), absl::UnavailableError(options_.name + " stopped"));
  }
  // Failures handed to the sender come back as tasks.
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    send_stop_ = true;
  }
  send_cv_.notify_all();
  sender_.join();
  // The sender's last hand-backs.
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
}

void PrefillWorker::Fail(JobPtr job, absl::Status error) {
  if (job->streamed > 0) {
    // The sender may still be reading the job's pages: it hands the job back when it is done.
    Enqueue({.job = std::move(job), .last = true, .error = std::move(error)});
    return;
  }
  if (job->cache != nullptr) job->cache->model_cache().RemoveSequence(job->seq).IgnoreError();
  job->done.set_value(std::move(error));
}

void PrefillWorker::Enqueue(Send send) {
  // The sender thread reads pages from the transport's copy of the pool: a device pool's pages
  // go there now, on the scheduler thread, which owns the cache.
  if (!send.pages.empty() && send.job != nullptr && send.error.ok()) {
    send.error = send.job->cache->ToTransport(send.pages);
  }
  if (send.last) ++sending_;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    sends_.push_back(std::move(send));
  }
  send_cv_.notify_all();
}

void PrefillWorker::Step() {
  // Jobs join the step in arrival order while the chunk budget lasts; a step runs one cache
  // (preset), the head job's.
  WorkerRuntime::Cache* cache = nullptr;
  std::vector<JobPtr> jobs;
  std::vector<int64_t> counts;
  std::vector<model::ForwardEntry> entries;
  int64_t budget = std::max(options_.step_tokens, options_.chunk_tokens);
  std::deque<JobPtr> keep;
  while (!queue_.empty()) {
    JobPtr job = std::move(queue_.front());
    queue_.pop_front();
    if (job->cache == nullptr) {
      auto c = rt_.CacheFor(job->request.compression().preset());
      absl::Status st = c.status();
      if (st.ok() && job->request.page_bytes() != (*c)->cache->pool().page_bytes()) {
        st = absl::InvalidArgumentError(absl::StrFormat(
            "the reservation's pages have %d bytes, preset %s's %d", job->request.page_bytes(),
            (*c)->cache->preset().name, (*c)->cache->pool().page_bytes()));
      }
      if (st.ok() && AwaitsSharedPrefix(*job, **c, {&keep, &queue_})) {
        keep.push_back(std::move(job));  // not started: it waits for the prefix's snapshot
        continue;
      }
      if (st.ok()) {
        job->seq = next_seq_++;
        st = StartSequence(*job, **c);
      }
      if (st.ok() && (*c)->wire) {
        // The prompt crosses transform-coded: its sinks and the rows the decode side's window
        // will hold exact, the rest coded as each chunk writes it.
        const int64_t n = job->request.prompt_size();
        const kvstore::KvWireBits bits = rt_.wire_bits();
        st = (*c)->wire->StartEncoding(
            job->seq, {.calibration = rt_.kv_calibration(),
                       .calibration_checksum = rt_.kv_calibration_checksum(),
                       .model = rt_.config(),
                       .key_bits = bits.key,
                       .value_bits = bits.value,
                       .shape = {.tokens = n, .tail = (*c)->cache->WindowAfterPrompt(n)}});
        if (!st.ok()) (*c)->cache->RemoveSequence(job->seq).IgnoreError();
        job->coded = st.ok();
      }
      if (!st.ok()) {
        Fail(std::move(job), st);
        continue;
      }
      job->cache = *c;
    }
    if (cache == nullptr) cache = job->cache;
    // A prompt is cut at fixed places, every chunk_tokens from its start, whatever else the
    // step holds: a chunk attends to those before it through the cache, so a prompt's KV would
    // otherwise depend on the prompts beside it. Chunks join whole while the budget lasts (the
    // head's always); presets that select from the whole prompt run it in one step.
    const int64_t left = job->request.prompt_size() - job->next;
    const bool whole = job->cache->cache->policy().selects_prompt();
    const int64_t n =
        whole ? left : std::min(options_.chunk_tokens - job->next % options_.chunk_tokens, left);
    if (job->cache != cache || (!entries.empty() && (n > budget || whole))) {
      keep.push_back(std::move(job));
      continue;
    }
    budget -= n;
    entries.push_back({job->seq, absl::MakeConstSpan(job->request.prompt().data() + job->next,
                                                     static_cast<size_t>(n))});
    counts.push_back(n);
    if (job->next + n == job->request.prompt_size() && !job->coded &&
        job->request.held().crc32c().empty()) {
      // The last chunk: each layer's pages leave as soon as the layer is done, where the
      // preset allows it (a prompt whose prefix the decode worker holds sends once it is done,
      // the pages it holds left out).
      Job* raw = job.get();
      // FailedPrecondition for presets whose pages change after a commit: they send once the
      // prompt is done. Each layer's pages follow the layers before it in export order.
      cache->cache
          ->StreamLayers(
              job->seq,
              [this, raw, weak = std::weak_ptr<Job>(job)](int, std::vector<kvstore::PageId> pages) {
                if (pages.empty()) return;
                Send send{.job = weak.lock(), .pages = std::move(pages), .first = raw->streamed};
                raw->streamed += static_cast<int64_t>(send.pages.size());
                streamed_pages_.Increment(static_cast<double>(send.pages.size()));
                Enqueue(std::move(send));
              })
          .IgnoreError();
    }
    jobs.push_back(job);
    keep.push_back(std::move(job));
  }
  queue_.swap(keep);
  if (entries.empty()) return;

  const model::LlamaConfig& config = rt_.config();
  if (PrefixesFor(*cache) != nullptr) {
    // Cached prefixes give way to the step: its chunks' pages, its snapshots' copies.
    int64_t need = 0;
    for (int64_t n : counts) {
      need += kvstore::PagesForSequence(cache->cache->preset(), config.layers, config.kv_heads,
                                        n + cache->cache->preset().residual)
                  .value_or(0) +
              ForkCopyPages();
    }
    MakeRoom(*cache, need);
  }
  const int64_t vocab = config.vocab;
  std::vector<float> logits(entries.size() * vocab);
  const absl::Time t0 = absl::Now();
  const absl::Status st =
      rt_.model().Forward(entries, cache->model_cache(), logits.data(), model::StepKind::kPrompt);
  const absl::Duration took = absl::Now() - t0;
  step_seconds_.Observe(absl::ToDoubleSeconds(took));
  // Finished (or failed) jobs leave the queue.
  for (size_t i = 0; i < jobs.size(); ++i) {
    const JobPtr& job = jobs[i];
    job->next += counts[i];
    job->compute += took;
    prompt_tokens_.Increment(static_cast<double>(counts[i]));
    const bool finished = job->next == job->request.prompt_size();
    if (st.ok()) Snapshot(*job);
    if (!st.ok() || finished) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), job));
      if (!st.ok()) {
        Fail(job, st);
      } else {
        Complete(job, absl::MakeConstSpan(logits.data() + i * vocab, vocab));
      }
    }
  }
}

void PrefillWorker::Complete(JobPtr job, absl::Span<const float> logits) {
  const rpc::PrefillRequest& req = job->request;
  const std::vector<int32_t> prompt(req.prompt().begin(), req.prompt().end());
  rpc::PrefillResponse& out = job->response;
  // Each choice's first token, drawn from the same logits with its own seed.
  const int choices = CheckedChoices(req.choices()).value_or(1);
  for (int choice = 0; choice < choices; ++choice) {
    const rpc::SamplingParams sp = ChoiceSampling(req.sampling(), choice);
    model::Sampler sampler(SamplingFromProto(sp));
    sampler.Skip(sp.skip_samples());
    const int32_t token = sampler.Sample(logits, prompt);
    rpc::GeneratedToken* first = choice == 0 ? out.mutable_first() : out.add_more_first();
    if (sp.logprobs()) {
      *first = TokenWithLogprobs(logits, token, sp.top_logprobs());
    } else {
      first->set_token(token);
    }
  }
  prefill_seconds_.Observe(absl::ToDoubleSeconds(job->compute));
  out.set_cached_tokens(job->cached);
  out.set_prefill_seconds(absl::ToDoubleSeconds(job->compute));
  std::string stream;
  if (job->coded) {
    auto coded = job->cache->wire->FinishEncoding(job->seq);
    if (!coded.ok()) {
      Fail(std::move(job), coded.status());
      return;
    }
    stream = *std::move(coded);
  }
  auto exported = job->cache->cache->ExportSequence(job->seq);
  if (!exported.ok()) {
    Fail(std::move(job), exported.status());
    return;
  }
  const model::LlamaConfig& c = rt_.config();
  const int64_t page_bytes = job->cache->cache->pool().page_bytes();
  const int64_t fp16_bytes = req.prompt_size() * c.layers * c.kv_heads * c.head_dim * 2 * 2;
  // What the decode side will hold: the pages and the state.
  out.set_kv_bytes(static_cast<int64_t>(exported->pages.size()) * page_bytes +
                   static_cast<int64_t>(exported->state.size()));
  out.set_kv_fp16_bytes(fp16_bytes);
  if (job->coded) {
    // One stream from the window's start, in place of pages and state.
    const int64_t room = int64_t{req.pages()} * page_bytes + req.state_bytes();
    if (static_cast<int64_t>(stream.size()) > room) {
      Fail(std::move(job), absl::ResourceExhaustedError(absl::StrFormat(
                               "the prompt's transform-coded KV takes %d bytes, the decode "
                               "worker's window holds %d",
                               stream.size(), room)));
      return;
    }
    out.set_pages(0);
    out.set_state_bytes(static_cast<int64_t>(stream.size()));
    out.set_state_crc32c(kvstore::Crc32c(stream.data(), stream.size()));
    out.set_wire_codec(kvstore::kKvWireCodecTransform);
    out.set_wire_calibration(rt_.kv_calibration_checksum());
    wire_bytes_kvtc_.Increment(static_cast<double>(stream.size()));
    wire_fp16_bytes_kvtc_.Increment(static_cast<double>(fp16_bytes));
    Enqueue({.job = job, .last = true, .state = std::move(stream), .coded = true});
    return;
  }
  if (kvstore::PrefixIndex* index = PrefixesFor(*job->cache); index != nullptr) {
    // For each block of the prompt that has a snapshot, the pages final once it was computed.
    rpc::PrefixMarks* marks = out.mutable_marks();
    for (int64_t snapshot : index->Path(prompt, req.prompt_size())) {
      auto shared = job->cache->cache->SharedLeadingPages(job->seq, snapshot);
      if (!shared.ok()) break;
      marks->mutable_pages()->Add(shared->begin(), shared->end());
    }
    if (marks->pages_size() > 0) {
      marks->set_block_tokens(options_.chunk_tokens);
      marks->set_runs(static_cast<int32_t>(exported->run_pages.size()));
    } else {
      out.clear_marks();
    }
  }
  // Pages the decode worker holds, bytes for bytes, stay here: each run's leading pages whose
  // checksums are the held ones'; the others go packed into the window.
  std::vector<kvstore::PageId> pages = std::move(exported->pages);
  if (!req.held().crc32c().empty()) {
    const rpc::HeldPrefix& held = req.held();
    if (held.pages_size() != static_cast<int>(exported->run_pages.size())) {
      Fail(std::move(job), absl::InvalidArgumentError(absl::StrFormat(
                               "held prefix: %d page runs, preset %s has %d", held.pages_size(),
                               job->cache->cache->preset().name, exported->run_pages.size())));
      return;
    }
    std::vector<kvstore::PageId> rest;
    int64_t at = 0, offered = 0;
    for (size_t x = 0; x < exported->run_pages.size(); ++x) {
      const int32_t run = exported->run_pages[x];
      int32_t same = 0;
      while (same < std::min(run, held.pages(x)) &&
             exported->crcs[at + same] == held.crc32c(offered + same)) {
        ++same;
      }
      out.add_held_pages(same);
      rest.insert(rest.end(), pages.begin() + at + same, pages.begin() + at + run);
      at += run;
      offered += held.pages(x);
    }
    out.set_held_bytes(static_cast<int64_t>(pages.size() - rest.size()) * page_bytes);
    held_bytes_.Increment(static_cast<double>(out.held_bytes()));
    pages = std::move(rest);
  }
  if (pages.size() > static_cast<size_t>(req.pages())) {
    Fail(std::move(job), absl::ResourceExhaustedError(absl::StrFormat(
                             "the prompt's KV takes %d pages, the decode worker reserved %d",
                             pages.size(), req.pages())));
    return;
  }
  const int64_t state_room = req.state_bytes();
  if (static_cast<int64_t>(exported->state.size()) > state_room) {
    Fail(std::move(job), absl::ResourceExhaustedError(absl::StrFormat(
                             "the prompt's KV state takes %d bytes, the decode worker reserved %d",
                             exported->state.size(), state_room)));
    return;
  }
  out.set_pages(static_cast<int64_t>(pages.size()));
  out.set_state_bytes(static_cast<int64_t>(exported->state.size()));
  out.set_state_crc32c(kvstore::Crc32c(exported->state.data(), exported->state.size()));
  wire_bytes_pages_.Increment(static_cast<double>(out.kv_bytes() - out.held_bytes()));
  wire_fp16_bytes_pages_.Increment(static_cast<double>(fp16_bytes));
  // What the layers did not stream yet, then the flush.
  Send send{.job = job, .first = job->streamed, .last = true, .state = std::move(exported->state)};
  send.pages.assign(pages.begin() + job->streamed, pages.end());
  Enqueue(std::move(send));
}

void PrefillWorker::SendLoop() {
  for (;;) {
    Send send;
    {
      std::unique_lock<std::mutex> lock(send_mu_);
      send_cv_.wait(lock, [&] { return send_stop_ || !sends_.empty(); });
      if (sends_.empty()) return;
      send = std::move(sends_.front());
      sends_.pop_front();
    }
    if (send.job == nullptr) continue;  // a layer of a job that is gone
    Job& job = *send.job;
    if (!send.error.ok() && job.send_error.ok()) job.send_error = send.error;
    if (job.send_error.ok()) {
      job.send_error = SendPages(send);
      if (!job.send_error.ok() && send.error.ok()) transfer_failures_.Increment();
    }
    if (!send.last) continue;
    job.sender.reset();  // a failed job's connection too
    // The scheduler owns the cache: it frees the pages and answers.
    Post([this, send = std::move(send)]() mutable {
      --sending_;
      Job& j = *send.job;
      j.cache->model_cache().RemoveSequence(j.seq).IgnoreError();
      j.cache = nullptr;
      if (!j.send_error.ok()) {
        j.done.set_value(j.send_error);
        return;
      }
      j.done.set_value(std::move(j.response));
    });
  }
}

absl::Status PrefillWorker::SendPages(Send& send) {
  Job& job = *send.job;
  const rpc::PrefillRequest& req = job.request;
  if (job.sender == nullptr) {
    auto sender = transport_.Connect(req.region());
    if (!sender.ok()) {
      return absl::AbortedError(
          absl::StrFormat("connecting to %s: %s", req.decode_worker(), sender.status().message()));
    }
    job.sender = *std::move(sender);
  }
  transport::Sender& sender = *job.sender;
  const size_t page_bytes = static_cast<size_t>(job.cache->cache->pool().page_bytes());
  if (job.send_start == absl::InfinitePast()) job.send_start = absl::Now();
  // The window: page i of the export at i * page_bytes, then the KV state (Complete checked
  // that both fit); the decode worker checks the state against the CRC32C the response carries.
  absl::Status st;
  for (size_t i = 0; i < send.pages.size() && st.ok(); ++i) {
    const uint64_t index = static_cast<uint64_t>(send.first) + i;
    st = sender.Put(job.cache->TransportPage(send.pages[i]), page_bytes, index * page_bytes);
    job.sent_bytes += static_cast<int64_t>(page_bytes);
  }
  if (st.ok() && send.last && !send.state.empty()) {
    st = sender.Put(send.state.data(), send.state.size(),
                    send.coded ? 0 : static_cast<uint64_t>(req.pages()) * page_bytes);
    job.sent_bytes += static_cast<int64_t>(send.state.size());
  }
  if (st.ok() && send.last) st = sender.Flush(options_.transfer_timeout);
  if (send.last || !st.ok()) job.sender.reset();
  if (!st.ok()) {
    // The router tells Aborted (the pages did not reach the decode worker) from other failures.
    return absl::AbortedError(
        absl::StrFormat("sending KV pages to %s: %s", req.decode_worker(), st.message()));
  }
  if (send.last) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - job.send_start);
    transfer_bytes_.Increment(static_cast<double>(job.sent_bytes));
    transfer_seconds_.Observe(seconds);
    job.response.set_transfer_bytes(job.sent_bytes);
    job.response.set_transfer_seconds(seconds);
  }
  return absl::OkStatus();
}

kvstore::PrefixIndex* PrefillWorker::PrefixesFor(WorkerRuntime::Cache& c) {
  if (options_.prefix_cache_entries <= 0 || c.wire || c.cache->policy().selects_prompt()) {
    return nullptr;
  }
  return &prefixes_.try_emplace(&c, options_.chunk_tokens).first->second;
}

absl::Status PrefillWorker::StartSequence(Job& job, WorkerRuntime::Cache& c) {
  const int64_t n = job.request.prompt_size();
  kvstore::PrefixIndex* index = PrefixesFor(c);
  if (index == nullptr) return c.cache->AddSequence(job.seq, n);
  prefix_queries_.Increment();
  prefix_query_tokens_.Increment(static_cast<double>(n));
  // The prompt's last token is always computed: its logits give the first token.
  const kvstore::PrefixIndex::Hit hit =
      index->Longest(absl::MakeConstSpan(job.request.prompt().data(), n), n - 1);
  if (hit.tokens > 0) {
    MakeRoom(c, ForkCopyPages());
    // A fork that finds no pages for its copies computes the prompt from its start.
    if (c.cache->ForkSequence(hit.seq, job.seq, n).ok()) {
      job.next = job.cached = hit.tokens;
      prefix_hit_tokens_.Increment(static_cast<double>(hit.tokens));
      return absl::OkStatus();
    }
  }
  return c.cache->AddSequence(job.seq, n);
}

bool PrefillWorker::AwaitsSharedPrefix(const Job& job, WorkerRuntime::Cache& c,
                                       std::initializer_list<const std::deque<JobPtr>*> jobs) {
  kvstore::PrefixIndex* index = PrefixesFor(c);
  if (index == nullptr) return false;
  const int64_t block = options_.chunk_tokens;
  const int64_t n = job.request.prompt_size();
  const auto prompt = absl::MakeConstSpan(job.request.prompt().data(), n);
  const int64_t cached = index->Longest(prompt, n - 1).tokens;
  for (const std::deque<JobPtr>* list : jobs) {
    for (const JobPtr& other : *list) {
      if (other->cache != &c) continue;  // not started, or another preset
      // The whole blocks both prompts start with (below this one's last token).
      const int64_t limit = std::min<int64_t>(n - 1, other->request.prompt_size());
      const int64_t common =
          std::mismatch(prompt.begin(), prompt.begin() + limit, other->request.prompt().begin())
              .first -
          prompt.begin();
      const int64_t shared = common / block * block;
      if (shared > cached && other->next < shared) return true;
    }
  }
  return false;
}

void PrefillWorker::Snapshot(Job& job) {
  kvstore::PrefixIndex* index = PrefixesFor(*job.cache);
  const int64_t block = options_.chunk_tokens;
  if (index == nullptr || job.next % block != 0) return;
  const auto prompt = absl::MakeConstSpan(job.request.prompt().data(), job.next);
  if (index->Holds(prompt, job.next)) return;
  MakeRoom(*job.cache, ForkCopyPages());
  // Entries hang below their parent: one evicted meanwhile leaves this prefix uncached.
  if (job.next > block && !index->Holds(prompt, job.next - block)) return;
  const int64_t snapshot = next_seq_++;
  if (!job.cache->cache->ForkSequence(job.seq, snapshot, job.next).ok()) return;
  if (!index->Insert(prompt, job.next, snapshot)) {
    job.cache->cache->RemoveSequence(snapshot).IgnoreError();
    return;
  }
  prefixes_changed_ = true;
  while (index->size() > options_.prefix_cache_entries) EvictPrefix(*job.cache, *index);
}

int64_t PrefillWorker::ForkCopyPages() const {
  return 2 * rt_.config().layers * rt_.config().kv_heads;
}

void PrefillWorker::MakeRoom(WorkerRuntime::Cache& c, int64_t pages) {
  kvstore::PrefixIndex* index = PrefixesFor(c);
  while (index != nullptr && index->size() > 0 && c.cache->pool().free_pages() < pages) {
    EvictPrefix(c, *index);
  }
}

void PrefillWorker::EvictPrefix(WorkerRuntime::Cache& c, kvstore::PrefixIndex& index) {
  if (std::optional<int64_t> seq = index.EvictLeastRecent()) {
    c.cache->RemoveSequence(*seq).IgnoreError();
    prefixes_changed_ = true;
    prefix_evictions_.Increment();
  }
}

int64_t PrefillWorker::DropPrefixCache() {
  std::promise<int64_t> done;
  std::future<int64_t> dropped = done.get_future();
  Post([&] {
    int64_t entries = 0;
    for (auto& [c, index] : prefixes_) {
      for (int64_t seq : index.Clear()) {
        c->cache->RemoveSequence(seq).IgnoreError();
        ++entries;
      }
    }
    prefixes_changed_ = true;
    done.set_value(entries);
  });
  return dropped.get();
}

void PrefillWorker::UpdateGauges() {
  int64_t waiting = 0, running = 0, tokens = 0, used = 0, free = 0;
  for (const auto& job : queue_) {
    (job->next == 0 ? waiting : running) += 1;
    tokens += job->request.prompt_size() - job->next;
  }
  running += sending_;
  for (const auto& [name, cache] : rt_.caches()) {
    used += cache.cache->pool().used_pages();
    free += cache.cache->pool().free_pages();
  }
  if (prefixes_changed_) {  // names, and the pages the snapshots hold, shared ones once
    prefix_pages_ = 0;
    prefix_names_.clear();
    for (const auto& [c, index] : prefixes_) {
      for (uint64_t h : index.Hashes()) prefix_names_.push_back(h);
      absl::flat_hash_set<kvstore::PageId> pages;
      for (int64_t seq : index.Sequences()) c->cache->CollectPages(seq, pages).IgnoreError();
      prefix_pages_ += static_cast<int64_t>(pages.size());
    }
    prefixes_changed_ = false;
  }
  const int64_t entries = static_cast<int64_t>(prefix_names_.size());
  prefix_entries_.Set(static_cast<double>(entries));
  running_gauge_.Set(static_cast<double>(running));
  waiting_gauge_.Set(static_cast<double>(waiting));
  queued_tokens_.Set(static_cast<double>(tokens));
  pool_resident_.Set(static_cast<double>(rt_.PoolResidentBytes()));
  std::lock_guard<std::mutex> lock(mu_);
  waiting += static_cast<int64_t>(waiting_.size());
  stats_.set_state(draining_ ? "draining" : "serving");
  stats_.set_loop_turned_unix_ms(absl::ToUnixMillis(absl::Now()));
  stats_.set_running(running);
  stats_.set_waiting(waiting);
  stats_.set_queued_prompt_tokens(tokens);
  // Pages the cached prefixes hold come back whenever a prompt needs them (those a running
  // prompt shares once it ends): free, as vLLM counts its cached blocks, so a worker whose
  // cache filled its pool stays ready.
  const int64_t cached = std::min(prefix_pages_, used);
  stats_.set_kv_pages_used(used - cached);
  stats_.set_kv_pages_free(free + cached);
  stats_.set_prefix_cache_entries(entries);
  stats_.set_prefix_cache_pages(prefix_pages_);
  stats_.set_prefix_block_tokens(options_.prefix_cache_entries > 0 ? options_.chunk_tokens : 0);
  stats_.mutable_prefix_blocks()->Assign(prefix_names_.begin(), prefix_names_.end());
}

rpc::StatsResponse PrefillWorker::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace sluice::prefill
