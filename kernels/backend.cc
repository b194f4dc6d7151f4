#include "kernels/backend.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace sluice::kernels {

std::string_view BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kRef:
      return "ref";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kRmsNorm:
      return "rms_norm";
    case Op::kMatmul:
      return "matmul";
    case Op::kGetRows:
      return "get_rows";
    case Op::kRope:
      return "rope";
    case Op::kSwiGlu:
      return "swiglu";
    case Op::kSoftmax:
      return "softmax";
    case Op::kAttention:
      return "attention";
  }
  return "unknown";
}

namespace {

absl::Status ValidateRmsNorm(const RmsNormParams& p) {
  if (p.rows < 0)
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: rows=%d < 0", p.rows));
  if (p.dim <= 0)
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: dim=%d <= 0", p.dim));
  if (!(p.eps >= 0.f)) {
    return absl::InvalidArgumentError(absl::StrFormat("rms_norm: eps=%g must be >= 0", p.eps));
  }
  if (p.rows > 0 && (p.x == nullptr || p.y == nullptr || p.weight == nullptr)) {
    return absl::InvalidArgumentError("rms_norm: x, weight and y must be non-null");
  }
  return absl::OkStatus();
}

absl::Status Invalid(std::string_view op, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", op, what));
}

absl::Status ValidateMatmul(const MatmulParams& p) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return Invalid("matmul", absl::StrFormat("bad shape m=%d n=%d k=%d", p.m, p.n, p.k));
  }
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.w_type));
  if (t == nullptr) return Invalid("matmul", "unknown weight type");
  if (p.k % t->block_size != 0) {
    return Invalid("matmul", absl::StrFormat("k=%d is not a multiple of the %s block size %d", p.k,
                                             t->name, t->block_size));
  }
  if (p.m > 0 && (p.x == nullptr || p.w == nullptr || p.y == nullptr)) {
    return Invalid("matmul", "x, w and y must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateGetRows(const GetRowsParams& p) {
  if (p.count < 0 || p.rows <= 0 || p.dim <= 0) {
    return Invalid("get_rows",
                   absl::StrFormat("bad shape count=%d rows=%d dim=%d", p.count, p.rows, p.dim));
  }
  const GgmlTypeTraits* t = FindGgmlType(static_cast<uint32_t>(p.table_type));
  if (t == nullptr || p.dim % t->block_size != 0) {
    return Invalid("get_rows", "dim is not a multiple of the table type's block size");
  }
  if (p.count > 0 && (p.table == nullptr || p.ids == nullptr || p.out == nullptr)) {
    return Invalid("get_rows", "table, ids and out must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateRope(const RopeParams& p) {
  if (p.tokens < 0 || p.heads <= 0 || p.head_dim <= 0 || p.rope_dim <= 0 || p.rope_dim % 2 != 0 ||
      p.rope_dim > p.head_dim) {
    return Invalid("rope", absl::StrFormat("bad shape tokens=%d heads=%d head_dim=%d rope_dim=%d",
                                           p.tokens, p.heads, p.head_dim, p.rope_dim));
  }
  if (!(p.theta_base > 0.f)) return Invalid("rope", "theta_base must be > 0");
  if (p.tokens > 0 && (p.x == nullptr || p.positions == nullptr)) {
    return Invalid("rope", "x and positions must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateSwiGlu(const SwiGluParams& p) {
  if (p.n < 0) return Invalid("swiglu", "n < 0");
  if (p.n > 0 && (p.gate == nullptr || p.up == nullptr || p.out == nullptr)) {
    return Invalid("swiglu", "gate, up and out must be non-null");
  }
  return absl::OkStatus();
}

absl::Status ValidateSoftmax(const SoftmaxParams& p) {
  if (p.rows < 0 || p.cols <= 0) {
    return Invalid("softmax", absl::StrFormat("bad shape rows=%d cols=%d", p.rows, p.cols));
  }
  if (p.rows > 0 && p.x == nullptr) return Invalid("softmax", "x must be non-null");
  return absl::OkStatus();
}

absl::Status ValidateAttention(const AttentionParams& p) {
  if (p.q_tokens < 0 || p.q_start < 0 || p.heads <= 0 || p.kv_heads <= 0 || p.head_dim <= 0 ||
      p.heads % p.kv_heads != 0) {
    return Invalid("attention",
                   absl::StrFormat("bad shape q_tokens=%d q_start=%d heads=%d kv_heads=%d "
                                   "head_dim=%d",
                                   p.q_tokens, p.q_start, p.heads, p.kv_heads, p.head_dim));
  }
  if (p.kv_tokens < p.q_start + p.q_tokens) {
    return Invalid("attention", absl::StrFormat("kv_tokens=%d < q_start + q_tokens = %d",
                                                p.kv_tokens, p.q_start + p.q_tokens));
  }
  if (p.q_tokens > 0 && (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr)) {
    return Invalid("attention", "q, k, v and out must be non-null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::RmsNorm(const RmsNormParams& p) {
  if (!Supports(Op::kRmsNorm)) return Unsupported(Op::kRmsNorm);
  SLUICE_RETURN_IF_ERROR(ValidateRmsNorm(p));
  if (p.rows == 0) return absl::OkStatus();
  return DoRmsNorm(p);
}

absl::Status Backend::Matmul(const MatmulParams& p) {
  if (!Supports(Op::kMatmul)) return Unsupported(Op::kMatmul);
  SLUICE_RETURN_IF_ERROR(ValidateMatmul(p));
  if (p.m == 0) return absl::OkStatus();
  return DoMatmul(p);
}

absl::Status Backend::GetRows(const GetRowsParams& p) {
  if (!Supports(Op::kGetRows)) return Unsupported(Op::kGetRows);
  SLUICE_RETURN_IF_ERROR(ValidateGetRows(p));
  if (p.count == 0) return absl::OkStatus();
  return DoGetRows(p);
}

absl::Status Backend::Rope(const RopeParams& p) {
  if (!Supports(Op::kRope)) return Unsupported(Op::kRope);
  SLUICE_RETURN_IF_ERROR(ValidateRope(p));
  if (p.tokens == 0) return absl::OkStatus();
  return DoRope(p);
}

absl::Status Backend::SwiGlu(const SwiGluParams& p) {
  if (!Supports(Op::kSwiGlu)) return Unsupported(Op::kSwiGlu);
  SLUICE_RETURN_IF_ERROR(ValidateSwiGlu(p));
  if (p.n == 0) return absl::OkStatus();
  return DoSwiGlu(p);
}

absl::Status Backend::Softmax(const SoftmaxParams& p) {
  if (!Supports(Op::kSoftmax)) return Unsupported(Op::kSoftmax);
  SLUICE_RETURN_IF_ERROR(ValidateSoftmax(p));
  if (p.rows == 0) return absl::OkStatus();
  return DoSoftmax(p);
}

absl::Status Backend::Attention(const AttentionParams& p) {
  if (!Supports(Op::kAttention)) return Unsupported(Op::kAttention);
  SLUICE_RETURN_IF_ERROR(ValidateAttention(p));
  if (p.q_tokens == 0) return absl::OkStatus();
  return DoAttention(p);
}

absl::Status Backend::DoRmsNorm(const RmsNormParams&) { return Unsupported(Op::kRmsNorm); }
absl::Status Backend::DoMatmul(const MatmulParams&) { return Unsupported(Op::kMatmul); }
absl::Status Backend::DoGetRows(const GetRowsParams&) { return Unsupported(Op::kGetRows); }
absl::Status Backend::DoRope(const RopeParams&) { return Unsupported(Op::kRope); }
absl::Status Backend::DoSwiGlu(const SwiGluParams&) { return Unsupported(Op::kSwiGlu); }
absl::Status Backend::DoSoftmax(const SoftmaxParams&) { return Unsupported(Op::kSoftmax); }
absl::Status Backend::DoAttention(const AttentionParams&) { return Unsupported(Op::kAttention); }

absl::Status Backend::Unsupported(Op op) const {
  return absl::UnimplementedError(
      absl::StrFormat("op %s is not supported by backend %s", OpName(op), name()));
}

}  // namespace sluice::kernels
