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

}  // namespace

absl::Status Backend::RmsNorm(const RmsNormParams& p) {
  if (!Supports(Op::kRmsNorm)) return Unsupported(Op::kRmsNorm);
  SLUICE_RETURN_IF_ERROR(ValidateRmsNorm(p));
  if (p.rows == 0) return absl::OkStatus();
  return DoRmsNorm(p);
}

absl::Status Backend::DoRmsNorm(const RmsNormParams&) { return Unsupported(Op::kRmsNorm); }

absl::Status Backend::Unsupported(Op op) const {
  return absl::UnimplementedError(
      absl::StrFormat("op %s is not supported by backend %s", OpName(op), name()));
}

}  // namespace sluice::kernels
