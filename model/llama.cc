#include "model/llama.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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
                                                             kernels::Backend& backend) {
  if (backend.kind() == kernels::BackendKind::kCuda) {
    return absl::UnimplementedError("the Llama forward runs on the cpu or ref backend for now");
  }
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
    return Weight{t->data, t->type};
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
  return model;
}

absl::Status LlamaModel::Matmul(const float* x, const Weight& w, float* y, int64_t m, int64_t n,
                                int64_t k) {
  return backend_.Matmul({.x = x, .w = w.data, .w_type = w.type, .y = y, .m = m, .n = n, .k = k});
}

absl::Status LlamaModel::Forward(absl::Span<const ForwardEntry> batch, KvCache& cache,
                                 float* logits) {
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
  SLUICE_RETURN_IF_ERROR(cache.BeginStep(step));
  absl::Status st = RunStep(batch, lengths, cache, logits);
  if (!st.ok()) cache.AbortStep();
  return st;
}

absl::Status LlamaModel::RunStep(absl::Span<const ForwardEntry> batch,
                                 absl::Span<const int64_t> lengths, KvCache& cache, float* logits) {
  const LlamaConfig& c = config_;
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
  const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;

  std::vector<float> x(m * c.hidden), h(m * c.hidden), q(m * q_dim), k(m * kv_dim), v(m * kv_dim),
      attn(m * q_dim), proj(m * c.hidden), gate(m * c.ffn), up(m * c.ffn);
  SLUICE_RETURN_IF_ERROR(backend_.GetRows({.table = token_embd_.data,
                                           .table_type = token_embd_.type,
                                           .ids = ids.data(),
                                           .out = x.data(),
                                           .count = m,
                                           .rows = c.vocab,
                                           .dim = c.hidden}));
  auto add = [&](const std::vector<float>& delta) {
    for (int64_t i = 0; i < m * c.hidden; ++i) x[i] += delta[i];
  };

  for (int li = 0; li < c.layers; ++li) {
    const Layer& l = layers_[li];
    SLUICE_RETURN_IF_ERROR(backend_.RmsNorm({.x = x.data(),
                                             .weight = l.attn_norm,
                                             .y = h.data(),
                                             .rows = m,
                                             .dim = c.hidden,
                                             .eps = c.rms_eps}));
    SLUICE_RETURN_IF_ERROR(Matmul(h.data(), l.q, q.data(), m, q_dim, c.hidden));
    SLUICE_RETURN_IF_ERROR(Matmul(h.data(), l.k, k.data(), m, kv_dim, c.hidden));
    SLUICE_RETURN_IF_ERROR(Matmul(h.data(), l.v, v.data(), m, kv_dim, c.hidden));
    for (auto [buf, heads] : {std::pair{q.data(), c.heads}, std::pair{k.data(), c.kv_heads}}) {
      SLUICE_RETURN_IF_ERROR(backend_.Rope({.x = buf,
                                            .positions = positions.data(),
                                            .tokens = m,
                                            .heads = heads,
                                            .head_dim = c.head_dim,
                                            .rope_dim = c.rope_dim,
                                            .theta_base = c.rope_theta,
                                            .neox = false}));
    }
    SLUICE_RETURN_IF_ERROR(cache.Write(li, k.data(), v.data()));
    SLUICE_RETURN_IF_ERROR(cache.Attend(li, q.data(), attn.data()));
    SLUICE_RETURN_IF_ERROR(cache.LayerDone(li));
    SLUICE_RETURN_IF_ERROR(Matmul(attn.data(), l.o, proj.data(), m, c.hidden, q_dim));
    add(proj);
    SLUICE_RETURN_IF_ERROR(backend_.RmsNorm({.x = x.data(),
                                             .weight = l.ffn_norm,
                                             .y = h.data(),
                                             .rows = m,
                                             .dim = c.hidden,
                                             .eps = c.rms_eps}));
    SLUICE_RETURN_IF_ERROR(Matmul(h.data(), l.gate, gate.data(), m, c.ffn, c.hidden));
    SLUICE_RETURN_IF_ERROR(Matmul(h.data(), l.up, up.data(), m, c.ffn, c.hidden));
    SLUICE_RETURN_IF_ERROR(backend_.SwiGlu(
        {.gate = gate.data(), .up = up.data(), .out = gate.data(), .n = m * c.ffn}));
    SLUICE_RETURN_IF_ERROR(Matmul(gate.data(), l.down, proj.data(), m, c.hidden, c.ffn));
    add(proj);
  }
  SLUICE_RETURN_IF_ERROR(cache.Commit());

  // Only each entry's last token needs logits.
  const int64_t b = static_cast<int64_t>(batch.size());
  std::vector<float> last(b * c.hidden);
  for (int64_t e = 0; e < b; ++e) {
    const int64_t row = starts[e] + static_cast<int64_t>(batch[e].tokens.size()) - 1;
    std::copy(x.begin() + row * c.hidden, x.begin() + (row + 1) * c.hidden,
              last.begin() + e * c.hidden);
  }
  SLUICE_RETURN_IF_ERROR(backend_.RmsNorm({.x = last.data(),
                                           .weight = output_norm_,
                                           .y = last.data(),
                                           .rows = b,
                                           .dim = c.hidden,
                                           .eps = c.rms_eps}));
  return Matmul(last.data(), output_, logits, b, c.vocab, c.hidden);
}

}  // namespace sluice::model
