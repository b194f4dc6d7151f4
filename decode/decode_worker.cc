#include "decode/decode_worker.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/sampling.h"
#include "common/status_macros.h"
#include "kvstore/kv_preset.h"
#include "kvstore/wire/crc32c.h"
#include "kvstore/wire/kv_wire_codec.h"

namespace sluice::decode {

void TokenStream::Push(rpc::GeneratedToken token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(std::move(token));
  }
  cv_.notify_all();
}

void TokenStream::Finish(std::string reason, absl::Status error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    reason_ = std::move(reason);
    error_ = std::move(error);
  }
  cv_.notify_all();
}

bool TokenStream::Take(std::vector<rpc::GeneratedToken>* tokens, std::string* reason,
                       absl::Status* error, absl::Duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [&] { return done_ || !tokens_.empty(); });
  while (!tokens_.empty()) {
    tokens->push_back(std::move(tokens_.front()));
    tokens_.pop_front();
  }
  if (!done_) return false;
  *reason = reason_;
  *error = error_;
  return true;
}

bool TokenStream::NextMessage(rpc::GenerateResponse* message, bool* done, absl::Status* error,
                              absl::Duration wait) {
  std::vector<rpc::GeneratedToken> tokens;
  std::string reason;
  *done = Take(&tokens, &reason, error, wait);
  if (tokens.empty() && !*done) return false;
  message->Clear();
  for (rpc::GeneratedToken& t : tokens) *message->add_tokens() = std::move(t);
  if (*done && error->ok()) message->set_finish_reason(reason);
  return true;
}

namespace {

const std::vector<double> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.1,   0.25,   0.5,   1.0,  2.5};
const std::vector<double> kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256};

// Pages one choice of a reservation with several may take beyond the prompt's, which it shares
// with the others: its generated tokens' pages and, at the fork, a copy of each page list's
// partly filled last page (one per tier).
int64_t ForkPages(const kvstore::KvPreset& preset, const model::LlamaConfig& c, int64_t prompt,
                  int64_t room) {
  const int64_t prompt_pages =
      kvstore::PagesForSequence(preset, c.layers, c.kv_heads, prompt).value_or(0);
  const int64_t room_pages =
      kvstore::PagesForSequence(preset, c.layers, c.kv_heads, room).value_or(0);
  const int64_t copies = int64_t{c.layers} * c.kv_heads * (preset.low ? 2 : 1);
  return room_pages - prompt_pages + std::min(copies, prompt_pages);
}

// The pages of every run, one after another.
std::vector<kvstore::PageId> Flatten(const std::vector<std::vector<kvstore::PageId>>& runs) {
  std::vector<kvstore::PageId> flat;
  for (const auto& run : runs) flat.insert(flat.end(), run.begin(), run.end());
  return flat;
}

}  // namespace

DecodeWorker::DecodeWorker(WorkerRuntime& runtime, prometheus::Registry& registry,
                           DecodeWorkerOptions options)
    : rt_(runtime),
      options_(std::move(options)),
      pages_used_(prometheus::BuildGauge()
                      .Name("sluice_kv_pages_used")
                      .Help("KV pages holding tokens, by tier (high, low) and preset.")
                      .Register(registry)),
      pages_free_(prometheus::BuildGauge()
                      .Name("sluice_kv_pages_free")
                      .Help("KV pages free in the pool, by preset.")
                      .Register(registry)),
      compression_(prometheus::BuildGauge()
                       .Name("sluice_kv_compression_ratio")
                       .Help("FP16 bytes of the live tokens over the bytes of their pages.")
                       .Register(registry)),
      fragmentation_(prometheus::BuildGauge()
                         .Name("sluice_kv_fragmentation_ratio")
                         .Help("1 - live token slots / allocated token slots.")
                         .Register(registry)),
      pages_total_(prometheus::BuildGauge()
                       .Name("sluice_kv_pages_total")
                       .Help("KV pages of the pool, by preset.")
                       .Register(registry)),
      page_bytes_(prometheus::BuildGauge()
                      .Name("sluice_kv_page_bytes")
                      .Help("Bytes of one KV page of the pool, by preset.")
                      .Register(registry)),
      compaction_seconds_(prometheus::BuildCounter()
                              .Name("sluice_kv_compaction_seconds_total")
                              .Help("Time spent compacting page lists, by preset.")
                              .Register(registry)),
      pages_reserved_(prometheus::BuildGauge()
                          .Name("sluice_kv_pages_reserved")
                          .Help("KV pages reserved for prompts whose pages are in flight.")
                          .Register(registry)
                          .Add({})),
      pool_resident_(PoolResidentGauge(registry)),
      running_gauge_(prometheus::BuildGauge()
                         .Name("sluice_requests_running")
                         .Help("Sequences in the decode batch.")
                         .Register(registry)
                         .Add({{"role", "decode"}})),
      generation_tokens_(prometheus::BuildCounter()
                             .Name("sluice_decode_tokens_total")
                             .Help("Tokens generated by decode steps.")
                             .Register(registry)
                             .Add({})),
      reservations_expired_(prometheus::BuildCounter()
                                .Name("sluice_kv_reservations_expired_total")
                                .Help("Reservations freed because their pages never came.")
                                .Register(registry)
                                .Add({})),
      import_failures_(prometheus::BuildCounter()
                           .Name("sluice_kv_import_failures_total")
                           .Help("Sequences whose received KV failed its checks.")
                           .Register(registry)
                           .Add({})),
      client_bound_refusals_(
          prometheus::BuildCounter()
              .Name("sluice_kv_client_bound_refusals_total")
              .Help("Reservations refused because the client held its share of the pool.")
              .Register(registry)
              .Add({})),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("sluice_decode_step_seconds")
                        .Help("Time of one decode step over the batch.")
                        .Register(registry)
                        .Add({}, kStepBuckets)),
      wire_decode_seconds_(prometheus::BuildHistogram()
                               .Name("sluice_kv_wire_decode_seconds")
                               .Help("Time to decode one transform-coded prompt into the cache.")
                               .Register(registry)
                               .Add({}, kStepBuckets)),
      batch_size_(prometheus::BuildHistogram()
                      .Name("sluice_decode_batch_size")
                      .Help("Sequences in one decode step.")
                      .Register(registry)
                      .Add({}, kBatchBuckets)),
      held_offered_tokens_(
          prometheus::BuildCounter()
              .Name("sluice_prefix_cache_held_offered_tokens_total")
              .Help("Prompt tokens of held prefixes offered to prefill workers at Reserve.")
              .Register(registry)
              .Add({})),
      held_evictions_(prometheus::BuildCounter()
                          .Name("sluice_prefix_cache_held_evictions_total")
                          .Help("Held prefixes let go (least recently used first).")
                          .Register(registry)
                          .Add({})),
      held_entries_(prometheus::BuildGauge()
                        .Name("sluice_prefix_cache_held_entries")
                        .Help("Prompt prefixes whose KV pages this decode worker keeps.")
                        .Register(registry)
                        .Add({})),
      held_pages_(prometheus::BuildGauge()
                      .Name("sluice_prefix_cache_held_pages")
                      .Help("KV pages that only held prefixes keep: free once let go.")
                      .Register(registry)
                      .Add({})) {
  stats_.set_name(options_.name);
  stats_.set_role("decode");
  stats_.set_backend(rt_.backend_name());
  stats_.set_state("serving");
  UpdateGauges();
  thread_ = std::thread([this] { Loop(); });
}

DecodeWorker::~DecodeWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

template <typename T>
T DecodeWorker::OnScheduler(std::function<T()> fn) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
  std::future<T> result = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("the decode worker is shutting down");
    tasks_.push_back([task] { (*task)(); });
  }
  cv_.notify_all();
  return result.get();
}

void DecodeWorker::Loop() {
  for (;;) {
    std::vector<std::function<void()>> tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (tasks_.empty() && running_.empty() && !stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
      }
      tasks.swap(tasks_);
      if (stop_) break;
    }
    for (auto& task : tasks) task();
    ExpireReservations();
    if (!running_.empty()) Step();
    // Stats() walks every page list: refresh the gauges a few times a second, not every step,
    // and at once when tasks changed what the pools hold.
    const absl::Time now = absl::Now();
    if (!tasks.empty() || now - gauges_at_ >= absl::Milliseconds(200)) {
      UpdateGauges();
      gauges_at_ = now;
    }
  }
  // Shutting down: tasks still queued get their answer, live sequences end.
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  while (!running_.empty()) {
    Finish(running_.begin()->first, "abort", absl::UnavailableError("decode worker stopped"));
  }
  while (!reservations_.empty()) FreeReservation(reservations_.begin());
  DropAllHeld();
}

absl::StatusOr<rpc::ReserveResponse> DecodeWorker::Reserve(const rpc::ReserveRequest& request,
                                                           const std::string& client) {
  if (draining_) return absl::UnavailableError(options_.name + " is draining");
  if (request.prompt_tokens() <= 0 || request.max_tokens() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt_tokens=%d and max_tokens=%d must be > 0", request.prompt_tokens(),
                        request.max_tokens()));
  }
  SLUICE_ASSIGN_OR_RETURN(const int choices, CheckedChoices(request.choices()));
  if (!request.prompt().empty() && request.prompt_size() != request.prompt_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the prompt has %d tokens, prompt_tokens says %d", request.prompt_size(),
                        request.prompt_tokens()));
  }
  return OnScheduler<absl::StatusOr<rpc::ReserveResponse>>(
      [&]() -> absl::StatusOr<rpc::ReserveResponse> {
        SLUICE_ASSIGN_OR_RETURN(WorkerRuntime::Cache * cache,
                                rt_.CacheFor(request.compression().preset()));
        const model::LlamaConfig& c = rt_.config();
        const int64_t room = int64_t{request.prompt_tokens()} + request.max_tokens();
        if (room > c.context_length) {
          return absl::OutOfRangeError(absl::StrFormat(
              "prompt (%d tokens) + max_tokens (%d) exceed the model's context of %d",
              request.prompt_tokens(), request.max_tokens(), c.context_length));
        }
        const kvstore::KvPreset& preset = cache->cache->preset();
        SLUICE_ASSIGN_OR_RETURN(
            int64_t prompt_pages,
            kvstore::PagesForSequence(preset, c.layers, c.kv_heads, request.prompt_tokens()));
        SLUICE_ASSIGN_OR_RETURN(int64_t room_pages,
                                kvstore::PagesForSequence(preset, c.layers, c.kv_heads, room));
        kvstore::PagePool& pool = cache->cache->mutable_pool();
        // Several choices share the prompt's pages and each may take ForkPages more.
        const int64_t need =
            choices == 1
                ? room_pages
                : prompt_pages + choices * ForkPages(preset, c, request.prompt_tokens(), room);
        int64_t available = pool.free_pages() - GrowthPages(cache);
        // Held prefixes give way to a request: never refused for pages they keep.
        while (need > available && EvictHeld(cache)) {
          available = pool.free_pages() - GrowthPages(cache);
        }
        if (need > available) {
          return absl::ResourceExhaustedError(
              absl::StrFormat("%s: the KV pool (preset %s) has %d pages to spare, the request "
                              "may need %d",
                              options_.name, preset.name, available, need));
        }
        SLUICE_RETURN_IF_ERROR(CheckClientBound(client, *cache, prompt_pages));
        // The window: the prompt's pages, then room for the KV state (full-precision window,
        // scores, codebooks). Only this reservation's sender can reach it.
        const int64_t page_bytes = pool.page_bytes();
        const int64_t state_bytes = cache->cache->StateBytesBound(request.prompt_tokens());
        Reservation r{.preset = preset.name,
                      .client = client,
                      .state_bytes = state_bytes,
                      .expires = absl::Now() + options_.reservation_ttl,
                      .choices = choices};
        SLUICE_ASSIGN_OR_RETURN(
            r.window,
            rt_.ReceiveWindow(static_cast<size_t>(prompt_pages * page_bytes + state_bytes)));
        std::vector<int64_t> offsets;
        SLUICE_RETURN_IF_ERROR(
            pool.Allocate({static_cast<int32_t>(prompt_pages)}, &offsets, &r.pages));
        uint64_t id = 0;  // random, never 0, never one that is live
        while (id == 0 || reservations_.contains(id)) id = absl::Uniform<uint64_t>(id_bits_);
        rpc::ReserveResponse out;
        out.set_reservation_id(id);
        out.set_pages(static_cast<int32_t>(prompt_pages));
        out.set_state_bytes(state_bytes);
        out.set_page_bytes(page_bytes);
        out.set_region(r.window->descriptor());
        out.set_transport(rt_.transport_name());
        out.set_expires_in_seconds(absl::ToDoubleSeconds(options_.reservation_ttl));
        OfferHeld(cache, request.prompt(), r, out.mutable_held());
        if (out.held().crc32c().empty()) out.clear_held();
        reservations_.emplace(id, std::move(r));
        return out;
      });
}

absl::Status DecodeWorker::CheckClientBound(const std::string& client,
                                            const WorkerRuntime::Cache& cache,
                                            int64_t pages) const {
  // A client's first reservation always counts as within its bound, so one prompt larger than
  // the bound still runs; beyond it, the client waits for its own reservations to end.
  int64_t held = 0, count = 0;
  for (const auto& [id, r] : reservations_) {
    if (r.client != client) continue;
    ++count;
    if (r.preset == cache.cache->preset().name) {
      held += static_cast<int64_t>(r.pages.size()) + r.parent_pages;
    }
  }
  if (count == 0) return absl::OkStatus();
  const int64_t bound = static_cast<int64_t>(options_.max_client_reserved_fraction *
                                             static_cast<double>(cache.cache->pool().num_pages()));
  if (count >= options_.max_client_reservations || held + pages > bound) {
    client_bound_refusals_.Increment();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: client %s holds %d reservations of %d pages (preset %s); a client may hold at "
        "most %d reservations and %d pages",
        options_.name, client.empty() ? "(in-process)" : client, count, held,
        cache.cache->preset().name, options_.max_client_reservations, bound));
  }
  return absl::OkStatus();
}

int64_t DecodeWorker::GrowthPages(const WorkerRuntime::Cache* cache) const {
  // Pages a running sequence may still take: what its room needs less what its prompt needed.
  const model::LlamaConfig& c = rt_.config();
  const kvstore::KvPreset& preset = cache->cache->preset();
  int64_t growth = 0;
  for (const auto& [seq, r] : running_) {
    if (r.cache != cache) continue;
    auto room = kvstore::PagesForSequence(preset, c.layers, c.kv_heads, r.room);
    auto now = kvstore::PagesForSequence(preset, c.layers, c.kv_heads,
                                         static_cast<int64_t>(r.history.size()));
    if (room.ok() && now.ok()) growth += std::max<int64_t>(0, *room - *now);
  }
  // The choices of an imported prompt that have not begun yet.
  for (const auto& [id, r] : reservations_) {
    if (r.parent == 0 || r.preset != preset.name) continue;
    growth += r.fork_pages * std::count(r.begun.begin(), r.begun.end(), false);
  }
  return growth;
}

void DecodeWorker::OfferHeld(WorkerRuntime::Cache* cache, absl::Span<const int32_t> prompt,
                             Reservation& r, rpc::HeldPrefix* offer) {
  const HeldEntry* best = nullptr;
  int64_t tokens = 0;
  for (auto& [key, held] : held_) {
    if (key.first != cache) continue;
    const kvstore::PrefixIndex::Hit hit =
        held.index.Longest(prompt, static_cast<int64_t>(prompt.size()));
    if (hit.tokens > tokens) {
      best = &held.entries.at(hit.seq);
      tokens = hit.tokens;
    }
  }
  if (best == nullptr) return;
  const std::vector<kvstore::PageId> flat = Flatten(best->pages);
  // The reservation keeps the pages it offers until it ends, whatever is let go meanwhile.
  if (flat.empty() || !cache->cache->mutable_pool().Retain(flat).ok()) return;
  r.held = best->pages;
  offer->set_tokens(tokens);
  for (const auto& run : best->pages) offer->add_pages(static_cast<int32_t>(run.size()));
  offer->mutable_crc32c()->Add(best->crcs.begin(), best->crcs.end());
  held_offered_tokens_.Increment(static_cast<double>(tokens));
}

void DecodeWorker::HoldPrefixes(WorkerRuntime::Cache* cache, int64_t seq,
                                absl::Span<const int32_t> prompt, const rpc::PrefixMarks& marks) {
  const int64_t block = marks.block_tokens();
  const int64_t runs = marks.runs();
  if (options_.held_prefix_entries <= 0 || marks.pages().empty() || block <= 0 || runs <= 0 ||
      marks.pages_size() % runs != 0) {
    return;
  }
  const int64_t blocks = marks.pages_size() / runs;
  if (blocks * block > static_cast<int64_t>(prompt.size())) return;
  // The most pages any block keeps of each run, and their checksums, read once.
  std::vector<int32_t> most(static_cast<size_t>(runs), 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t x = 0; x < runs; ++x) {
      most[x] = std::max(most[x], marks.pages(static_cast<int>(b * runs + x)));
    }
  }
  absl::StatusOr<std::vector<std::vector<kvstore::PageId>>> pages =
      cache->cache->LeadingPages(seq, most);
  if (!pages.ok()) return;  // marks for another shape or beyond the prompt's pages
  const std::vector<kvstore::PageId> flat = Flatten(*pages);
  absl::StatusOr<std::vector<uint32_t>> crcs = cache->cache->PageCrcs(flat);
  if (!crcs.ok()) return;
  HeldPrefixes& held = held_.try_emplace({cache, block}, block).first->second;
  kvstore::PagePool& pool = cache->cache->mutable_pool();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t length = (b + 1) * block;
    if (held.index.Holds(prompt, length)) continue;
    HeldEntry entry;
    std::vector<kvstore::PageId> mine;
    size_t at = 0;
    for (int64_t x = 0; x < runs; ++x) {
      const int32_t n = marks.pages(static_cast<int>(b * runs + x));
      entry.pages.emplace_back((*pages)[x].begin(), (*pages)[x].begin() + n);
      mine.insert(mine.end(), entry.pages.back().begin(), entry.pages.back().end());
      entry.crcs.insert(entry.crcs.end(), crcs->begin() + at, crcs->begin() + at + n);
      at += (*pages)[x].size();
    }
    if (!pool.Retain(mine).ok()) break;
    const int64_t id = next_held_++;
    if (!held.index.Insert(prompt, length, id)) {  // its parent went meanwhile
      pool.Free(mine).IgnoreError();
      break;
    }
    held.entries.emplace(id, std::move(entry));
    held_changed_ = true;
  }
  while (held.index.size() > options_.held_prefix_entries && EvictHeld(cache)) {
  }
}

bool DecodeWorker::EvictHeld(const WorkerRuntime::Cache* cache) {
  for (auto& [key, held] : held_) {
    if (key.first != cache || held.index.size() == 0) continue;
    const std::optional<int64_t> id = held.index.EvictLeastRecent();
    if (!id) continue;
    auto entry = held.entries.find(*id);
    cache->cache->mutable_pool().Free(Flatten(entry->second.pages)).IgnoreError();
    held.entries.erase(entry);
    held_evictions_.Increment();
    held_changed_ = true;
    return true;
  }
  return false;
}

int64_t DecodeWorker::HeldOnlyPages(const WorkerRuntime::Cache* cache) const {
  const kvstore::PagePool& pool = cache->cache->pool();
  std::vector<int32_t> refs(static_cast<size_t>(pool.num_pages()), 0);
  int64_t only = 0;
  for (const auto& [key, held] : held_) {
    if (key.first != cache) continue;
    for (const auto& [id, entry] : held.entries) {
      for (const auto& run : entry.pages) {
        for (kvstore::PageId p : run) {
          // Counted once, when the held references reach the page's.
          if (++refs[p] == pool.refcount(p)) ++only;
        }
      }
    }
  }
  return only;
}

int64_t DecodeWorker::DropAllHeld() {
  int64_t dropped = 0;
  for (auto& [key, held] : held_) {
    while (EvictHeld(key.first)) ++dropped;
  }
  held_.clear();
  held_changed_ = true;
  return dropped;
}

int64_t DecodeWorker::DropHeldPrefixes() {
  // A worker shutting down lets go of them itself.
  return OnScheduler<absl::StatusOr<int64_t>>(
             [&]() -> absl::StatusOr<int64_t> { return DropAllHeld(); })
      .value_or(0);
}

void DecodeWorker::FreeReservation(std::map<uint64_t, Reservation>::iterator it) {
  auto cache = rt_.caches().find(it->second.preset);
  if (cache != rt_.caches().end()) {
    cache->second.cache->mutable_pool().Free(it->second.pages).IgnoreError();
    cache->second.cache->mutable_pool().Free(Flatten(it->second.held)).IgnoreError();
    // An imported prompt's pages go with it, but for those its choices share.
    if (it->second.parent != 0) {
      cache->second.cache->RemoveSequence(static_cast<int64_t>(it->second.parent)).IgnoreError();
    }
  }
  reservations_.erase(it);  // unexposes the window: late puts land nowhere
}

absl::StatusOr<std::map<uint64_t, DecodeWorker::Reservation>::iterator>
DecodeWorker::FindReservation(uint64_t id, const std::string& client) {
  auto it = reservations_.find(id);
  // Another client's reservation reads as unknown: its holder is not told apart from a guess.
  if (it == reservations_.end() || it->second.client != client) {
    return absl::NotFoundError(absl::StrFormat("reservation %d is unknown or has expired", id));
  }
  return it;
}

absl::StatusOr<rpc::RenewResponse> DecodeWorker::Renew(uint64_t reservation_id,
                                                       const std::string& client) {
  return OnScheduler<absl::StatusOr<rpc::RenewResponse>>(
      [&]() -> absl::StatusOr<rpc::RenewResponse> {
        SLUICE_ASSIGN_OR_RETURN(auto it, FindReservation(reservation_id, client));
        it->second.expires = absl::Now() + options_.reservation_ttl;
        rpc::RenewResponse out;
        out.set_expires_in_seconds(absl::ToDoubleSeconds(options_.reservation_ttl));
        return out;
      });
}

absl::Status DecodeWorker::Release(uint64_t reservation_id, const std::string& client) {
  return OnScheduler<absl::Status>([&]() -> absl::Status {
    SLUICE_ASSIGN_OR_RETURN(auto it, FindReservation(reservation_id, client));
    FreeReservation(it);
    return absl::OkStatus();
  });
}

void DecodeWorker::ExpireReservations() {
  const absl::Time now = absl::Now();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    auto next = std::next(it);
    if (it->second.expires <= now) {
      reservations_expired_.Increment();
      FreeReservation(it);
    }
    it = next;
  }
}

absl::StatusOr<std::string> DecodeWorker::TakeState(const Reservation& r,
                                                    const rpc::GenerateRequest& request) {
  const int64_t bytes = request.state_bytes();
  // A transform-coded stream fills the window from its start; a state follows the pages.
  const bool coded = request.wire_codec() != 0;
  const int64_t room =
      coded ? static_cast<int64_t>(r.window->size()) : static_cast<int64_t>(r.state_bytes);
  if (bytes <= 0 || bytes > room) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes announced, the reservation's window holds %d",
                        coded ? "KV wire stream" : "KV sequence state", bytes, room));
  }
  const auto* window = static_cast<const uint8_t*>(r.window->base());
  const size_t at = coded ? 0 : r.window->size() - r.state_bytes;
  std::string state(reinterpret_cast<const char*>(window + at), static_cast<size_t>(bytes));
  const uint32_t crc = kvstore::Crc32c(state.data(), state.size());
  if (crc != request.state_crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "KV sequence state: CRC32C %08x, the sender's was %08x", crc, request.state_crc32c()));
  }
  return state;
}

absl::StatusOr<std::shared_ptr<TokenStream>> DecodeWorker::Generate(
    const rpc::GenerateRequest& request, const std::string& client) {
  const rpc::SamplingParams& sp = request.sampling();
  SLUICE_ASSIGN_OR_RETURN(const model::SamplingParams params, CheckedSampling(sp));
  if (request.prompt().empty()) return absl::InvalidArgumentError("the prompt is empty");
  // A replay is tokens this request generated: fewer than max_tokens (the first is one), each
  // in the vocabulary.
  if (request.replay_size() >= std::max(params.max_tokens, 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("replay: %d tokens, max_tokens is %d (the first token counts)",
                        request.replay_size(), params.max_tokens));
  }
  for (const int32_t t : request.replay()) {
    if (t < 0 || t >= rt_.config().vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "replay: token %d is not in the vocabulary (%d tokens)", t, rt_.config().vocab));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(const int choices, CheckedChoices(request.choices()));
  if (request.choice() < 0 || request.choice() >= choices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("choice %d of %d does not exist", request.choice(), choices));
  }
  std::unique_ptr<DecodedPrompt> decoded;
  if (request.wire_codec() != 0) {
    SLUICE_ASSIGN_OR_RETURN(decoded, DecodeWire(request, client));
  }
  return OnScheduler<absl::StatusOr<std::shared_ptr<TokenStream>>>(
      [&]() -> absl::StatusOr<std::shared_ptr<TokenStream>> {
        SLUICE_ASSIGN_OR_RETURN(auto it, FindReservation(request.reservation_id(), client));
        WorkerRuntime::Cache* cache = &rt_.caches().find(it->second.preset)->second;
        if (rt_.PresetName(request.compression().preset()) != it->second.preset) {
          FreeReservation(it);
          return absl::InvalidArgumentError(
              absl::StrFormat("the request names preset '%s', its reservation was for '%s'",
                              request.compression().preset(), it->second.preset));
        }
        if (choices != it->second.choices) {
          const int reserved = it->second.choices;
          FreeReservation(it);
          return absl::InvalidArgumentError(absl::StrFormat(
              "the request names %d choices, its reservation was for %d", choices, reserved));
        }
        const int64_t room = request.prompt_size() + params.max_tokens;
        if (choices > 1) return GenerateChoice(it, request, cache, room, decoded.get());
        const uint64_t seq = next_id_++;
        if (absl::Status st = ImportReserved(it->second, request, cache, seq, room, decoded.get());
            !st.ok()) {
          FreeReservation(it);
          return st;
        }
        FreeReservation(it);
        return StartRunning(request, cache, seq, room);
      });
}

absl::StatusOr<std::unique_ptr<DecodeWorker::DecodedPrompt>> DecodeWorker::DecodeWire(
    const rpc::GenerateRequest& request, const std::string& client) {
  // Fails the reservation as an import failure, on the scheduler.
  auto fail = [&](absl::Status st) -> absl::Status {
    import_failures_.Increment();
    OnScheduler<absl::Status>([&] {
      auto it = FindReservation(request.reservation_id(), client);
      if (it.ok()) FreeReservation(*it);
      return absl::OkStatus();
    }).IgnoreError();
    return st;
  };
  SLUICE_ASSIGN_OR_RETURN(
      const std::string stream,
      OnScheduler<absl::StatusOr<std::string>>([&]() -> absl::StatusOr<std::string> {
        SLUICE_ASSIGN_OR_RETURN(auto it, FindReservation(request.reservation_id(), client));
        if (it->second.parent != 0) return std::string();  // imported by the first choice
        absl::Status st = CheckWire(request);
        absl::StatusOr<std::string> taken =
            st.ok() ? TakeState(it->second, request) : absl::StatusOr<std::string>(st);
        if (!taken.ok()) {
          import_failures_.Increment();
          FreeReservation(it);
        }
        return taken;
      }));
  if (stream.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(decode_mu_);
  const absl::Time start = absl::Now();
  absl::StatusOr<kvstore::KvWireDecoder> decoder =
      kvstore::KvWireDecoder::Open(rt_.kv_calibration(), rt_.kv_calibration_checksum(),
                                   rt_.kv_calibration_path(), rt_.config(), stream);
  if (!decoder.ok()) return fail(decoder.status());
  // The prompt's length bounds what is allocated, whatever the stream claims.
  if (decoder->shape().tokens != request.prompt_size()) {
    return fail(absl::InvalidArgumentError(
        absl::StrFormat("the KV wire stream holds %d tokens, the prompt has %d",
                        decoder->shape().tokens, request.prompt_size())));
  }
  const model::LlamaConfig& c = rt_.config();
  auto out = std::make_unique<DecodedPrompt>();
  out->shape = decoder->shape();
  const size_t rows = static_cast<size_t>(out->shape.tokens * c.kv_heads * c.head_dim);
  for (int layer = 0; layer < c.layers; ++layer) {
    out->k.emplace_back(rows);
    out->v.emplace_back(rows);
    if (absl::Status st = decoder->DecodeLayer(layer, out->k.back().data(), out->v.back().data());
        !st.ok()) {
      return fail(st);
    }
  }
  wire_decode_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return out;
}

absl::Status DecodeWorker::ImportReserved(Reservation& reserved,
                                          const rpc::GenerateRequest& request,
                                          WorkerRuntime::Cache* cache, uint64_t seq, int64_t room,
                                          DecodedPrompt* decoded) {
  // Each run's leading pages the prefill worker left out: the reservation's held ones.
  std::vector<std::vector<kvstore::PageId>> held;
  if (request.held_pages_size() > 0 &&
      request.held_pages_size() != static_cast<int>(reserved.held.size())) {
    import_failures_.Increment();
    return absl::InvalidArgumentError(
        absl::StrFormat("the request takes held pages of %d runs, its reservation holds %d",
                        request.held_pages_size(), reserved.held.size()));
  }
  for (int x = 0; x < request.held_pages_size(); ++x) {
    const int32_t n = request.held_pages(x);
    if (n < 0 || n > static_cast<int32_t>(reserved.held[x].size())) {
      import_failures_.Increment();
      return absl::InvalidArgumentError(
          absl::StrFormat("the request takes %d held pages of run %d, its reservation holds %d", n,
                          x, reserved.held[x].size()));
    }
    held.emplace_back(reserved.held[x].begin(), reserved.held[x].begin() + n);
  }
  // The state the prefill worker wrote after the pages, checked against its CRC32C; the pages
  // it put move from the window into the pool, where the import checks each one.
  const int64_t sent = request.pages();
  if (request.wire_codec() != 0) {
    // The prompt's rows, decoded off the scheduler (DecodeWire), commit into the cache's own
    // format; the reservation's pages go back to the pool first, for the commit to take.
    if (decoded == nullptr) {
      import_failures_.Increment();
      return absl::FailedPreconditionError("a transform-coded prompt arrived undecoded");
    }
    cache->cache->mutable_pool().Free(reserved.pages).IgnoreError();
    reserved.pages.clear();
    reserved.window.reset();
    const absl::Status imported = ImportWire(*cache, seq, room, request.prompt_size(), *decoded);
    if (!imported.ok()) import_failures_.Increment();
    return imported;
  }
  absl::StatusOr<std::string> state = TakeState(reserved, request);
  // A prompt that fits the full-precision window sends no page at all.
  if (state.ok() && (sent < 0 || sent > static_cast<int64_t>(reserved.pages.size()))) {
    state = absl::InvalidArgumentError(
        absl::StrFormat("the request announces %d pages sent, the reservation's window holds %d",
                        sent, reserved.pages.size()));
  }
  if (!state.ok()) {
    import_failures_.Increment();
    return state.status();
  }
  const int64_t prompt = request.prompt_size();
  kvstore::PagePool& pool = cache->cache->mutable_pool();
  const absl::Span<const kvstore::PageId> pages =
      absl::MakeConstSpan(reserved.pages).subspan(0, static_cast<size_t>(sent));
  const absl::Status moved =
      cache->cache->CopyPagesFromHost(pages, static_cast<const uint8_t*>(reserved.window->base()),
                                      kvstore::PagedKvCache::HostLayout::kPacked);
  reserved.window.reset();  // unexposed: nothing reaches these pages any more
  absl::StatusOr<int64_t> imported =
      moved.ok()
          ? cache->cache->ImportSequence(static_cast<int64_t>(seq), room, *state, pages, held)
          : absl::StatusOr<int64_t>(moved);
  if (!imported.ok()) {
    import_failures_.Increment();
    return imported.status();
  }
  // The sequence owns the pages it imported; the reservation's other pages go back.
  reserved.pages.erase(reserved.pages.begin(), reserved.pages.begin() + *imported);
  pool.Free(reserved.pages).IgnoreError();
  reserved.pages.clear();
  if (auto length = cache->cache->Length(static_cast<int64_t>(seq));
      !length.ok() || *length != prompt) {
    cache->cache->RemoveSequence(static_cast<int64_t>(seq)).IgnoreError();
    return absl::InvalidArgumentError(absl::StrFormat(
        "the KV state holds %d tokens, the prompt has %d", length.value_or(-1), prompt));
  }
  HoldPrefixes(cache, static_cast<int64_t>(seq), request.prompt(), request.marks());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TokenStream>> DecodeWorker::GenerateChoice(
    std::map<uint64_t, Reservation>::iterator it, const rpc::GenerateRequest& request,
    WorkerRuntime::Cache* cache, int64_t room, DecodedPrompt* decoded) {
  Reservation& reserved = it->second;
  if (reserved.parent == 0) {
    const uint64_t parent = next_id_++;
    if (absl::Status st = ImportReserved(reserved, request, cache, parent, room, decoded);
        !st.ok()) {
      FreeReservation(it);
      return st;
    }
    reserved.parent = parent;
    reserved.room = room;
    reserved.expires = absl::Now() + options_.reservation_ttl;  // for the other choices to come
    reserved.begun.assign(static_cast<size_t>(reserved.choices), false);
    const model::LlamaConfig& c = rt_.config();
    const kvstore::KvPreset& preset = cache->cache->preset();
    reserved.parent_pages =
        kvstore::PagesForSequence(preset, c.layers, c.kv_heads, request.prompt_size()).value_or(0);
    reserved.fork_pages = ForkPages(preset, c, request.prompt_size(), room);
  } else if (room != reserved.room ||
             cache->cache->Length(static_cast<int64_t>(reserved.parent)).value_or(-1) !=
                 request.prompt_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "choice %d: a prompt of %d tokens and %d to generate, the reservation's first choice had "
        "%d tokens in all",
        request.choice(), request.prompt_size(), room - request.prompt_size(), reserved.room));
  }
  if (reserved.begun[static_cast<size_t>(request.choice())]) {
    return absl::AlreadyExistsError(absl::StrFormat("choice %d of reservation %d began already",
                                                    request.choice(), request.reservation_id()));
  }
  const uint64_t seq = next_id_++;
  SLUICE_RETURN_IF_ERROR(cache->cache->ForkSequence(static_cast<int64_t>(reserved.parent),
                                                    static_cast<int64_t>(seq), room));
  reserved.begun[static_cast<size_t>(request.choice())] = true;
  if (std::all_of(reserved.begun.begin(), reserved.begun.end(), [](bool b) { return b; })) {
    FreeReservation(it);  // the parent goes; its pages stay where the choices share them
  }
  return StartRunning(request, cache, seq, room);
}

absl::Status DecodeWorker::CheckWire(const rpc::GenerateRequest& request) const {
  if (request.wire_codec() != kvstore::kKvWireCodecTransform) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV wire codec %d is not this decode worker's (%d: transform-coded, rANS)",
                        request.wire_codec(), kvstore::kKvWireCodecTransform));
  }
  if (rt_.kv_calibration() == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the prompt's KV arrived transform-coded (calibration %08x) and this decode worker "
        "loaded no calibration (--kv_calibration)",
        options_.name, request.wire_calibration()));
  }
  if (request.wire_calibration() != rt_.kv_calibration_checksum()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the prompt's KV was coded with calibration %08x, %s is calibration %08x (the "
        "prefill and decode workers must load the same file)",
        options_.name, request.wire_calibration(), rt_.kv_calibration_path(),
        rt_.kv_calibration_checksum()));
  }
  return absl::OkStatus();
}

absl::Status DecodeWorker::ImportWire(WorkerRuntime::Cache& cache, uint64_t seq, int64_t room,
                                      int64_t prompt, DecodedPrompt& decoded) {
  // DecodeWire checked the stream's tokens against the prompt; the window is the cache's.
  if (decoded.shape.tail != cache.cache->WindowAfterPrompt(prompt)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the KV wire stream keeps %d rows exact at the end, preset %s keeps %d in its window",
        decoded.shape.tail, cache.cache->preset().name, cache.cache->WindowAfterPrompt(prompt)));
  }
  return cache.cache->AddSequenceFromRows(static_cast<int64_t>(seq), room, prompt,
                                          [&](int layer, float* k, float* v) {
                                            std::vector<float>& dk = decoded.k[layer];
                                            std::vector<float>& dv = decoded.v[layer];
                                            std::copy(dk.begin(), dk.end(), k);
                                            std::copy(dv.begin(), dv.end(), v);
                                            // Each layer's rows go once in the cache's window,
                                            // so the import holds about one copy in all.
                                            std::vector<float>().swap(dk);
                                            std::vector<float>().swap(dv);
                                            return absl::OkStatus();
                                          });
}

absl::StatusOr<std::shared_ptr<TokenStream>> DecodeWorker::StartRunning(
    const rpc::GenerateRequest& request, WorkerRuntime::Cache* cache, uint64_t seq, int64_t room) {
  const rpc::SamplingParams& sp = request.sampling();
  SLUICE_ASSIGN_OR_RETURN(const model::SamplingParams params, CheckedSampling(sp));
  Running r;
  r.request_id = request.request_id();
  r.seq = static_cast<int64_t>(seq);
  r.cache = cache;
  r.params = params;
  r.sampler = std::make_unique<model::Sampler>(params);
  // The prefill worker sampled the first token (after the ones a migrated request made).
  r.sampler->Skip(1 + sp.skip_samples());
  r.history.assign(request.prompt().begin(), request.prompt().end());
  r.last = request.first().token();
  r.history.push_back(r.last);
  r.replay.assign(request.replay().begin(), request.replay().end());
  r.generated = 1;
  r.room = room;
  r.logprobs = request.sampling().logprobs();
  r.top_logprobs = request.sampling().top_logprobs();
  r.stream = std::make_shared<TokenStream>();
  r.last_token_time = absl::Now();
  auto stream = r.stream;
  running_.emplace(seq, std::move(r));
  // The first token may already end it.
  const bool stop = std::find(params.stop_tokens.begin(), params.stop_tokens.end(),
                              request.first().token()) != params.stop_tokens.end();
  if (stop) {
    Finish(seq, "stop");
  } else if (params.max_tokens <= 1) {
    Finish(seq, "length");
  }
  return stream;
}

void DecodeWorker::Cancel(const std::shared_ptr<TokenStream>& stream) {
  // Fire and forget: the scheduler removes the sequence before its next step.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    tasks_.push_back([this, stream] {
      for (auto& [seq, r] : running_) {
        if (r.stream == stream) {
          Finish(seq, "abort", absl::CancelledError("the client went away"));
          return;
        }
      }
    });
  }
  cv_.notify_all();
}

void DecodeWorker::Finish(uint64_t seq, const std::string& reason, absl::Status error) {
  auto it = running_.find(seq);
  if (it == running_.end()) return;
  it->second.cache->cache->RemoveSequence(static_cast<int64_t>(seq)).IgnoreError();
  it->second.stream->Finish(reason, std::move(error));
  running_.erase(it);
}

void DecodeWorker::Step() {
  const absl::Time start = absl::Now();
  // One forward per cache: a batch shares its KV cache.
  std::map<WorkerRuntime::Cache*, std::vector<Running*>> groups;
  for (auto& [seq, r] : running_) {
    std::vector<Running*>& g = groups[r.cache];
    if (static_cast<int>(g.size()) < options_.max_batch) g.push_back(&r);
  }
  int64_t batch = 0;
  for (auto& [cache, group] : groups) {
    batch += static_cast<int64_t>(group.size());
    StepGroup(cache, group);
  }
  step_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  batch_size_.Observe(static_cast<double>(batch));
}

void DecodeWorker::StepGroup(WorkerRuntime::Cache* cache, std::vector<Running*>& group) {
  const int64_t vocab = rt_.config().vocab;
  std::vector<model::ForwardEntry> entries;
  for (Running* r : group) entries.push_back({r->seq, absl::MakeConstSpan(&r->last, 1)});
  std::vector<float> logits(entries.size() * vocab);
  const absl::Status st =
      rt_.model().Forward(entries, *cache->cache, logits.data(), model::StepKind::kDecode);
  if (!st.ok()) {
    // A failed step leaves no way to tell which sequence's cache is sound: end them all.
    std::vector<uint64_t> seqs;
    for (Running* r : group) seqs.push_back(static_cast<uint64_t>(r->seq));
    for (uint64_t seq : seqs) Finish(seq, "abort", st);
    return;
  }
  std::vector<uint64_t> done_stop, done_length;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < group.size(); ++i) {
    Running& r = *group[i];
    if (r.replayed < r.replay.size()) {
      // Replayed: the token the failed worker sampled here, its draw skipped, not sent again.
      const int32_t token = r.replay[r.replayed++];
      r.sampler->Skip(1);
      r.history.push_back(token);
      r.last = token;
      ++r.generated;
      r.last_token_time = now;
      continue;
    }
    const absl::Span<const float> row(logits.data() + i * vocab, vocab);
    const int32_t token = r.sampler->Sample(row, r.history);
    rpc::GeneratedToken out;
    if (r.logprobs) {
      out = TokenWithLogprobs(row, token, r.top_logprobs);
    } else {
      out.set_token(token);
    }
    r.stream->Push(std::move(out));
    generation_tokens_.Increment();
    r.history.push_back(token);
    r.last = token;
    ++r.generated;
    r.last_token_time = now;
    if (std::find(r.params.stop_tokens.begin(), r.params.stop_tokens.end(), token) !=
        r.params.stop_tokens.end()) {
      done_stop.push_back(r.seq);
    } else if (r.generated >= r.params.max_tokens ||
               static_cast<int64_t>(r.history.size()) >= r.room) {
      done_length.push_back(r.seq);
    }
  }
  for (uint64_t seq : done_stop) Finish(seq, "stop");
  for (uint64_t seq : done_length) Finish(seq, "length");
}

void DecodeWorker::UpdateGauges() {
  int64_t used = 0, free = 0, reserved = 0;
  double ratio = 0;
  for (const auto& [seq, r] : reservations_) {
    reserved += static_cast<int64_t>(r.pages.size());
  }
  int64_t held_entries = 0, held_pages = 0, held_block = 0;
  const HeldPrefixes* widest = nullptr;  // the index the stats name
  for (const auto& [key, held] : held_) {
    held_entries += held.index.size();
    if (widest == nullptr || held.index.size() > widest->index.size()) {
      widest = &held;
      held_block = key.second;
    }
  }
  // The held prefixes' names, made again only when they changed.
  std::vector<uint64_t> names;
  const bool renamed = held_changed_;
  if (renamed && widest != nullptr) names = widest->index.Hashes();
  held_changed_ = false;
  for (const auto& [name, cache] : rt_.caches()) {
    const kvstore::KvCacheStats s = cache.cache->Stats();
    const kvstore::PagePool& pool = cache.cache->pool();
    // Pages only held prefixes keep count as free: a reservation lets them go.
    const int64_t held_only = held_.empty() ? 0 : HeldOnlyPages(&cache);
    held_pages += held_only;
    pages_used_.Add({{"tier", "high"}, {"preset", name}}).Set(s.pages.pages_high);
    pages_used_.Add({{"tier", "low"}, {"preset", name}}).Set(s.pages.pages_low);
    pages_free_.Add({{"preset", name}}).Set(pool.free_pages() + held_only);
    pages_total_.Add({{"preset", name}}).Set(pool.num_pages());
    page_bytes_.Add({{"preset", name}}).Set(static_cast<double>(pool.page_bytes()));
    double& seen = compaction_seen_[name];
    compaction_seconds_.Add({{"preset", name}}).Increment(s.compaction_seconds - seen);
    seen = s.compaction_seconds;
    compression_.Add({{"preset", name}}).Set(s.pages.compression_ratio());
    fragmentation_.Add({{"preset", name}}).Set(s.pages.fragmentation());
    used += pool.used_pages() - held_only;
    free += pool.free_pages() + held_only;
    if (s.held_bytes() > 0) ratio = s.ratio_vs_fp16();
  }
  held_entries_.Set(static_cast<double>(held_entries));
  held_pages_.Set(static_cast<double>(held_pages));
  pages_reserved_.Set(static_cast<double>(reserved));
  pool_resident_.Set(static_cast<double>(rt_.PoolResidentBytes()));
  running_gauge_.Set(static_cast<double>(running_.size()));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.set_state(draining_ ? "draining" : "serving");
  stats_.set_loop_turned_unix_ms(absl::ToUnixMillis(absl::Now()));
  stats_.set_running(static_cast<int64_t>(running_.size()));
  stats_.set_waiting(0);
  stats_.set_kv_pages_used(used);
  stats_.set_kv_pages_free(free);
  stats_.set_kv_pages_reserved(reserved);
  stats_.set_kv_compression_ratio(ratio);
  stats_.set_prefix_cache_entries(held_entries);
  stats_.set_prefix_cache_pages(held_pages);
  stats_.set_prefix_block_tokens(held_block);
  if (renamed) {
    stats_.clear_prefix_blocks();
    stats_.mutable_prefix_blocks()->Add(names.begin(), names.end());
  }
}

rpc::StatsResponse DecodeWorker::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace sluice::decode
