#include "tools/eval_metrics.h"

#include <cmath>
#include <vector>

namespace sluice::tools {
namespace {

// log p for every token (log-softmax in double), and the index of the largest logit.
void LogSoftmax(const float* logits, int64_t vocab, std::vector<double>* out, int64_t* argmax) {
  out->resize(vocab);
  double mx = logits[0];
  *argmax = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > mx) {
      mx = logits[i];
      *argmax = i;
    }
  }
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - mx);
  const double log_z = mx + std::log(sum);
  for (int64_t i = 0; i < vocab; ++i) (*out)[i] = logits[i] - log_z;
}

}  // namespace

TokenMetrics CompareLogits(const float* logits, const float* ref_logits, int64_t vocab,
                           int32_t target) {
  thread_local std::vector<double> lp, lq;
  int64_t top, top_ref;
  LogSoftmax(logits, vocab, &lq, &top);
  LogSoftmax(ref_logits, vocab, &lp, &top_ref);
  TokenMetrics m;
  m.nll = -lq[target];
  m.nll_ref = -lp[target];
  for (int64_t i = 0; i < vocab; ++i) m.kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  m.kl = m.kl < 0 ? 0 : m.kl;  // rounding can leave -1e-17 for identical distributions
  m.top1 = top == top_ref;
  return m;
}

void EvalTotals::Add(const TokenMetrics& m) {
  ++count_;
  nll_ += m.nll;
  nll_ref_ += m.nll_ref;
  kl_ += m.kl;
  top1_ += m.top1 ? 1 : 0;
}

double EvalTotals::ppl() const { return count_ == 0 ? 0 : std::exp(nll_ / count_); }
double EvalTotals::ppl_ref() const { return count_ == 0 ? 0 : std::exp(nll_ref_ / count_); }
double EvalTotals::kl() const { return count_ == 0 ? 0 : kl_ / count_; }
double EvalTotals::top1() const {
  return count_ == 0 ? 0 : static_cast<double>(top1_) / static_cast<double>(count_);
}

}  // namespace sluice::tools
