#include "kernels/ref/ref_backend.h"

#include "kernels/ref/rmsnorm.h"

namespace sluice::kernels {

bool RefBackend::Supports(Op op) const {
  switch (op) {
    case Op::kRmsNorm:
      return true;
  }
  return false;
}

absl::Status RefBackend::DoRmsNorm(const RmsNormParams& p) {
  ref::RmsNorm(p);
  return absl::OkStatus();
}

}  // namespace sluice::kernels
