#include "model/llama.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/ggml_quant.h"

namespace sluice::model {
namespace {

absl::StatusOr<int64_t> GetPositive(const GgufFile& g, const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(int64_t v, g.GetInt(key));
  if (v <= 0) return absl::InvalidArgumentError(absl::StrFormat("%s=%d must be > 0", key, v));
  return v;
}

int64_t GetIntOr(const GgufFile& g, const std::string& key, int64_t fallback) {
  auto v = g.GetInt(key);
  return v.ok() ? *v : fallback;
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfig::FromGguf(const GgufFile& g) {
  LlamaConfig c;
  SLUICE_ASSIGN_OR_RETURN(c.architecture, g.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return absl::UnimplementedError(absl::StrFormat(
        "architecture '%s' is not supported yet (supported: llama)", c.architecture));
  }
  const std::string a = c.architecture + ".";
  SLUICE_ASSIGN_OR_RETURN(int64_t layers, GetPositive(g, a + "block_count"));
  c.layers = static_cast<int>(layers);
  SLUICE_ASSIGN_OR_RETURN(c.hidden, GetPositive(g, a + "embedding_length"));
  SLUICE_ASSIGN_OR_RETURN(c.ffn, GetPositive(g, a + "feed_forward_length"));
  SLUICE_ASSIGN_OR_RETURN(c.heads, GetPositive(g, a + "attention.head_count"));
  c.kv_heads = GetIntOr(g, a + "attention.head_count_kv", c.heads);
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%sattention.head_count_kv=%d must divide head_count=%d", a, c.kv_heads, c.heads));
  }
  if (c.hidden % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "embedding_length %d is not a multiple of head_count %d", c.hidden, c.heads));
  }
  c.head_dim = GetIntOr(g, a + "attention.key_length", c.hidden / c.heads);
  c.rope_dim = GetIntOr(g, a + "rope.dimension_count", c.head_dim);
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%srope.dimension_count=%d is invalid for head_dim %d", a, c.rope_dim, c.head_dim));
  }
  c.context_length = GetIntOr(g, a + "context_length", 2048);
  if (auto theta = g.GetFloat(a + "rope.freq_base"); theta.ok()) c.rope_theta = *theta;
  if (auto eps = g.GetFloat(a + "attention.layer_norm_rms_epsilon"); eps.ok()) c.rms_eps = *eps;
  const GgufTensor* emb = g.FindTensor("token_embd.weight");
  if (emb == nullptr) return absl::InvalidArgumentError("GGUF has no tensor token_embd.weight");
  if (emb->dims.size() != 2 || emb->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token_embd.weight has shape [%s], expected [%d, vocab]",
                        absl::StrJoin(emb->dims, ", "), c.hidden));
  }
  c.vocab = emb->dims[1];
  c.tied_output = g.FindTensor("output.weight") == nullptr;
  return c;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const GgufFile& g,
                                                             kernels::Backend& backend,
                                                             const LlamaLoadOptions& options) {
  for (kernels::Op op : {kernels::Op::kRmsNorm, kernels::Op::kMatmul, kernels::Op::kGetRows,
                         kernels::Op::kRope, kernels::Op::kSwiGlu, kernels::Op::kAttention}) {
    if (!backend.Supports(op)) {
      return absl::UnimplementedError(
          absl::StrFormat("backend %s does not support %s", backend.name(), kernels::OpName(op)));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::FromGguf(g));
  auto model = std::unique_ptr<LlamaModel>(new LlamaModel(c, backend));

  auto tensor = [&](const std::string& name,
                    std::vector<int64_t> dims) -> absl::StatusOr<const GgufTensor*> {
    const GgufTensor* t = g.FindTensor(name);
    if (t == nullptr) return absl::InvalidArgumentError("GGUF has no tensor " + name);
    if (t->dims != dims) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor %s has shape [%s], expected [%s]",
                                                        name, absl::StrJoin(t->dims, ", "),
                                                        absl::StrJoin(dims, ", ")));
    }
    return t;
  };
  auto weight = [&](const std::string& name, std::vector<int64_t> dims) -> absl::StatusOr<Weight> {
    SLUICE_ASSIGN_OR_RETURN(const GgufTensor* t, tensor(name, dims));
    return Weight{t->data, t->type, t->bytes, dims[1], dims[0]};
  };
  auto norm = [&](const std::string& name) -> absl::StatusOr<const float*> {
    SLUICE_ASSIGN_OR_RETURN(const GgufTensor* t, tensor(name, {c.hidden}));
    if (t->type == kernels::GgmlType::kF32) return reinterpret_cast<const float*>(t->data);
    SLUICE_ASSIGN_OR_RETURN(std::vector<float> v, g.ToFloat(*t));
    model->owned_norms_.push_back(std::move(v));
    return model->owned_norms_.back().data();
  };

  model->owned_norms_.reserve(2 * c.layers + 1);
  SLUICE_ASSIGN_OR_RETURN(model->token_embd_, weight("token_embd.weight", {c.hidden, c.vocab}));
  model->output_ = model->token_embd_;
  if (!c.tied_output) {
    SLUICE_ASSIGN_OR_RETURN(model->output_, weight("output.weight", {c.hidden, c.vocab}));
  }
  SLUICE_ASSIGN_OR_RETURN(model->output_norm_, norm("output_norm.weight"));
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = absl::StrFormat("blk.%d.", i);
    Layer l;
    SLUICE_ASSIGN_OR_RETURN(l.attn_norm, norm(p + "attn_norm.weight"));
    SLUICE_ASSIGN_OR_RETURN(l.ffn_norm, norm(p + "ffn_norm.weight"));
    SLUICE_ASSIGN_OR_RETURN(l.q, weight(p + "attn_q.weight", {c.hidden, q_dim}));
    SLUICE_ASSIGN_OR_RETURN(l.k, weight(p + "attn_k.weight", {c.hidden, kv_dim}));
    SLUICE_ASSIGN_OR_RETURN(l.v, weight(p + "attn_v.weight", {c.hidden, kv_dim}));
    SLUICE_ASSIGN_OR_RETURN(l.o, weight(p + "attn_output.weight", {q_dim, c.hidden}));
    SLUICE_ASSIGN_OR_RETURN(l.gate, weight(p + "ffn_gate.weight", {c.hidden, c.ffn}));
    SLUICE_ASSIGN_OR_RETURN(l.up, weight(p + "ffn_up.weight", {c.hidden, c.ffn}));
    SLUICE_ASSIGN_OR_RETURN(l.down, weight(p + "ffn_down.weight", {c.ffn, c.hidden}));
    model->layers_.push_back(l);
  }
  if (backend.memory_space() == kernels::MemorySpace::kDevice) {
    SLUICE_RETURN_IF_ERROR(model->UploadWeights(options.bf16_on_device));
  }
  model->record_steps_ = options.record_steps && backend.CanRecord();
  return model;
}

absl::Status LlamaModel::UploadWeights(bool bf16) {
  const size_t norm_bytes = config_.hidden * sizeof(float);
  constexpr size_t kAlign = 256;
  const auto aligned = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  // Every weight and norm once, in load order; the output head only when it is not tied.
  std::vector<Weight*> weights = {&token_embd_};
  if (!config_.tied_output) weights.push_back(&output_);
  std::vector<const float**> norms = {&output_norm_};
  for (Layer& l : layers_) {
    norms.push_back(&l.attn_norm);
    norms.push_back(&l.ffn_norm);
    for (Weight* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) weights.push_back(w);
  }
  // A matrix as it goes to the device: its GGUF bytes, or bf16.
  const auto device_bytes = [bf16](const Weight& w) {
    return bf16 ? static_cast<size_t>(w.rows * w.cols) * sizeof(uint16_t) : w.bytes;
  };
  size_t total = norms.size() * aligned(norm_bytes);
  for (const Weight* w : weights) total += aligned(device_bytes(*w));
  SLUICE_ASSIGN_OR_RETURN(device_weights_, kernels::DeviceBuffer::Create(backend_, total));
  uint8_t* base = device_weights_.as<uint8_t>();
  size_t at = 0;
  const auto place = [&](const void* src, size_t bytes) -> absl::StatusOr<uint8_t*> {
    uint8_t* dst = base + at;
    SLUICE_RETURN_IF_ERROR(backend_.CopyToDevice(dst, src, bytes));
    at += aligned(bytes);
    return dst;
  };
  std::vector<float> row;
  std::vector<uint16_t> converted;
  for (Weight* w : weights) {
    const void* src = w->data;
    if (bf16 && w->type != kernels::GgmlType::kBF16) {
      // Row by row through fp32, rounded to nearest even.
      const kernels::GgmlTypeTraits* t = kernels::FindGgmlType(static_cast<uint32_t>(w->type));
      const int64_t row_bytes = w->cols / t->block_size * t->type_size;
      row.resize(w->cols);
      converted.resize(w->rows * w->cols);
      for (int64_t r = 0; r < w->rows; ++r) {
        kernels::DequantizeRow(w->type, static_cast<const uint8_t*>(w->data) + r * row_bytes,
                               row.data(), w->cols);
        for (int64_t c = 0; c < w->cols; ++c) {
          converted[r * w->cols + c] = kernels::FloatToBf16(row[c]);
        }
      }
      src = converted.data();
    }
    SLUICE_ASSIGN_OR_RETURN(uint8_t * dst, place(src, device_bytes(*w)));
    w->data = dst;
    if (bf16) {
      w->type = kernels::GgmlType::kBF16;
      w->bytes = device_bytes(*w);
    }
  }
  if (bf16) precision_ = kernels::MatmulPrecision::kBf16;
  if (config_.tied_output) output_ = token_embd_;
  for (const float** n : norms) {
    SLUICE_ASSIGN_OR_RETURN(uint8_t * dst, place(*n, norm_bytes));
    *n = reinterpret_cast<const float*>(dst);
  }
  owned_norms_.clear();  // the device holds them now
  return absl::OkStatus();
}

absl::Status LlamaModel::EnsureScratch(int64_t rows, int64_t batch) {
  const LlamaConfig& c = config_;
  Scratch& s = scratch_;
  const auto grow = [&](kernels::DeviceBuffer& b, int64_t elements, size_t size) {
    const size_t bytes = static_cast<size_t>(elements) * size;
    if (b.size() >= bytes) return absl::OkStatus();
    b.Reset();
    SLUICE_ASSIGN_OR_RETURN(b, kernels::DeviceBuffer::Create(backend_, bytes));
    return absl::OkStatus();
  };
  if (rows > s.rows) {
    const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    for (auto [b, width] : {std::pair{&s.x, c.hidden},
                            {&s.h, c.hidden},
                            {&s.q, q_dim},
                            {&s.k, kv_dim},
                            {&s.v, kv_dim},
                            {&s.attn, q_dim},
                            {&s.gate, c.ffn},
                            {&s.up, c.ffn}}) {
      SLUICE_RETURN_IF_ERROR(grow(*b, rows * width, sizeof(float)));
    }
    SLUICE_RETURN_IF_ERROR(grow(s.tokens, 2 * rows, sizeof(int32_t)));
    s.rows = rows;
    recordings_.clear();  // they name the old buffers
  }
  if (batch > s.batch) {
    SLUICE_RETURN_IF_ERROR(grow(s.last, batch * c.hidden, sizeof(float)));
    if (backend_.memory_space() == kernels::MemorySpace::kDevice) {
      SLUICE_RETURN_IF_ERROR(grow(s.logits, batch * c.vocab, sizeof(float)));
    }
    s.batch = batch;
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Matmul(const float* x, const Weight& w, float* y, int64_t m, int64_t n,
                                int64_t k, kernels::MatmulRows rows, bool accumulate) {
  return backend_.Matmul({.x = x,
                          .w = w.data,
                          .w_type = w.type,
                          .y = y,
                          .m = m,
                          .n = n,
                          .k = k,
                          .precision = precision_,
                          .accumulate = accumulate,
                          .rows = rows});
}

int64_t LlamaModel::recorded_segments() const {
  int64_t n = 0;
  for (const auto& [rows, segments] : recordings_) {
    for (const auto& r : segments) n += r != nullptr;
  }
  return n;
}

absl::Status LlamaModel::Segment(int64_t rows, int index, absl::FunctionRef<absl::Status()> ops) {
  if (!record_steps_ || rows > kMaxRecordedRows || unrecordable_rows_.contains(rows)) {
    return ops();
  }
  std::vector<std::unique_ptr<kernels::Backend::Recording>>& segments = recordings_[rows];
  segments.resize(config_.layers + 1);
  if (segments[index] == nullptr) {
    absl::StatusOr<std::unique_ptr<kernels::Backend::Recording>> recorded = backend_.Record(ops);
    if (!recorded.ok()) {
      // Nothing of it ran. An op of this row count cannot be recorded (FailedPrecondition), or
      // the device refused the graph: issue the ops one by one, as without recording (an error
      // of the ops themselves comes back from there).
      LOG(WARNING) << "decode steps of " << rows << " rows run unrecorded: " << recorded.status();
      unrecordable_rows_.insert(rows);
      recordings_.erase(rows);
      return ops();
    }
    segments[index] = std::move(*recorded);
  }
  return backend_.Replay(*segments[index]);
}

absl::Status LlamaModel::Forward(absl::Span<const ForwardEntry> batch, KvCache& cache,
                                 float* logits, StepKind kind) {
  if (batch.empty()) return absl::OkStatus();
  std::vector<StepEntry> step;
  step.reserve(batch.size());
  for (const ForwardEntry& e : batch) {
    step.push_back({.seq = e.seq, .tokens = static_cast<int64_t>(e.tokens.size())});
  }
  // The positions are the committed lengths, which BeginStep checks; look them up first so a
  // bad entry fails before the step opens.
  std::vector<int64_t> lengths;
  for (const ForwardEntry& e : batch) {
    if (e.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("sequence %d has no new tokens", e.seq));
    }
    SLUICE_ASSIGN_OR_RETURN(int64_t len, cache.Length(e.seq));
    lengths.push_back(len);
  }
  if (kind == StepKind::kAuto) {
    kind = absl::c_any_of(batch, [](const ForwardEntry& e) { return e.tokens.size() > 1; })
               ? StepKind::kPrompt
               : StepKind::kDecode;
  }
  SLUICE_RETURN_IF_ERROR(cache.BeginStep(step));
  absl::Status st = RunStep(batch, lengths, kind, cache, logits);
  if (!st.ok()) cache.AbortStep();
  return st;
}

absl::Status LlamaModel::RunStep(absl::Span<const ForwardEntry> batch,
                                 absl::Span<const int64_t> lengths, StepKind kind, KvCache& cache,
                                 float* logits) {
  const LlamaConfig& c = config_;
  // The layers' matmuls by the kind of step; the logits' (a row per entry) always kFew.
  const kernels::MatmulRows rows_kind =
      kind == StepKind::kPrompt ? kernels::MatmulRows::kMany : kernels::MatmulRows::kFew;
  // Flatten every entry's new tokens into one [m, hidden] activation matrix.
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> starts;  // per entry: its first row
  for (size_t e = 0; e < batch.size(); ++e) {
    starts.push_back(static_cast<int64_t>(ids.size()));
    for (size_t j = 0; j < batch[e].tokens.size(); ++j) {
      const int32_t t = batch[e].tokens[j];
      if (t < 0 || t >= c.vocab) {
        return absl::InvalidArgumentError(
            absl::StrFormat("token id %d of sequence %d is outside the vocabulary [0, %d)", t,
                            batch[e].seq, c.vocab));
      }
      ids.push_back(t);
      positions.push_back(static_cast<int32_t>(lengths[e] + j));
    }
  }
  const int64_t m = static_cast<int64_t>(ids.size());
  const int64_t b = static_cast<int64_t>(batch.size());
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
  SLUICE_RETURN_IF_ERROR(EnsureScratch(m, b));
  Scratch& s = scratch_;
  float* x = s.x.as<float>();
  float* h = s.h.as<float>();
  float* q = s.q.as<float>();
  float* k = s.k.as<float>();
  float* v = s.v.as<float>();
  float* attn = s.attn.as<float>();
  float* gate = s.gate.as<float>();
  float* up = s.up.as<float>();
  // Ids and positions in one copy: [ids, positions], packed at the step's row count.
  ids.insert(ids.end(), positions.begin(), positions.end());
  SLUICE_RETURN_IF_ERROR(s.tokens.Upload(ids.data(), ids.size() * sizeof(int32_t)));
  const int32_t* device_ids = s.tokens.as<int32_t>();
  const int32_t* device_positions = device_ids + m;
  // The dense ops between the cache's calls, in segments (see Segment): the embedding and layer
  // 0's attention input, then each layer's feed-forward with the next layer's attention input.
  const auto attention_input = [&](int li) -> absl::Status {
    const Layer& l = layers_[li];
    SLUICE_RETURN_IF_ERROR(backend_.RmsNorm(
        {.x = x, .weight = l.attn_norm, .y = h, .rows = m, .dim = c.hidden, .eps = c.rms_eps}));
    SLUICE_RETURN_IF_ERROR(Matmul(h, l.q, q, m, q_dim, c.hidden, rows_kind));
    SLUICE_RETURN_IF_ERROR(Matmul(h, l.k, k, m, kv_dim, c.hidden, rows_kind));
    SLUICE_RETURN_IF_ERROR(Matmul(h, l.v, v, m, kv_dim, c.hidden, rows_kind));
    for (auto [buf, heads] : {std::pair{q, c.heads}, std::pair{k, c.kv_heads}}) {
      SLUICE_RETURN_IF_ERROR(backend_.Rope({.x = buf,
                                            .positions = device_positions,
                                            .tokens = m,
                                            .heads = heads,
                                            .head_dim = c.head_dim,
                                            .rope_dim = c.rope_dim,
                                            .theta_base = c.rope_theta,
                                            .neox = false}));
    }
    return absl::OkStatus();
  };
  const auto feed_forward = [&](int li) -> absl::Status {
    const Layer& l = layers_[li];
    // The residual stream takes the projections in place: x += attn o^T, later x += ... down^T.
    SLUICE_RETURN_IF_ERROR(
        Matmul(attn, l.o, x, m, c.hidden, q_dim, rows_kind, /*accumulate=*/true));
    SLUICE_RETURN_IF_ERROR(backend_.RmsNorm(
        {.x = x, .weight = l.ffn_norm, .y = h, .rows = m, .dim = c.hidden, .eps = c.rms_eps}));
    SLUICE_RETURN_IF_ERROR(Matmul(h, l.gate, gate, m, c.ffn, c.hidden, rows_kind));
    SLUICE_RETURN_IF_ERROR(Matmul(h, l.up, up, m, c.ffn, c.hidden, rows_kind));
    SLUICE_RETURN_IF_ERROR(backend_.SwiGlu({.gate = gate, .up = up, .out = gate, .n = m * c.ffn}));
    return Matmul(gate, l.down, x, m, c.hidden, c.ffn, rows_kind, /*accumulate=*/true);
  };
  SLUICE_RETURN_IF_ERROR(Segment(m, 0, [&]() -> absl::Status {
    SLUICE_RETURN_IF_ERROR(backend_.GetRows({.table = token_embd_.data,
                                             .table_type = token_embd_.type,
                                             .ids = device_ids,
                                             .out = x,
                                             .count = m,
                                             .rows = c.vocab,
                                             .dim = c.hidden}));
    return attention_input(0);
  }));
  for (int li = 0; li < c.layers; ++li) {
    SLUICE_RETURN_IF_ERROR(cache.Write(li, k, v));
    SLUICE_RETURN_IF_ERROR(cache.Attend(li, q, attn));
    SLUICE_RETURN_IF_ERROR(cache.LayerDone(li));
    SLUICE_RETURN_IF_ERROR(Segment(m, li + 1, [&]() -> absl::Status {
      SLUICE_RETURN_IF_ERROR(feed_forward(li));
      return li + 1 < c.layers ? attention_input(li + 1) : absl::OkStatus();
    }));
  }
  SLUICE_RETURN_IF_ERROR(cache.Commit());

  // Only each entry's last token needs logits.
  float* last = s.last.as<float>();
  std::vector<kernels::Backend::Copy> rows;
  rows.reserve(b);
  for (int64_t e = 0; e < b; ++e) {
    const int64_t row = starts[e] + static_cast<int64_t>(batch[e].tokens.size()) - 1;
    rows.push_back({.dst = last + e * c.hidden,
                    .src = x + row * c.hidden,
                    .bytes = static_cast<size_t>(c.hidden) * sizeof(float)});
  }
  SLUICE_RETURN_IF_ERROR(backend_.CopyOnDevice(rows));
  SLUICE_RETURN_IF_ERROR(backend_.RmsNorm({.x = last,
                                           .weight = output_norm_,
                                           .y = last,
                                           .rows = b,
                                           .dim = c.hidden,
                                           .eps = c.rms_eps}));
  if (backend_.memory_space() == kernels::MemorySpace::kHost) {
    return Matmul(last, output_, logits, b, c.vocab, c.hidden, kernels::MatmulRows::kFew);
  }
  SLUICE_RETURN_IF_ERROR(
      Matmul(last, output_, s.logits.as<float>(), b, c.vocab, c.hidden, kernels::MatmulRows::kFew));
  return s.logits.Download(logits, static_cast<size_t>(b * c.vocab) * sizeof(float));
}

}  // namespace sluice::model
