// Next-token metrics of `sluice eval`: a prediction under compressed KV against the same
// prediction under fp16 KV (the reference) and the text's actual next token.
#ifndef SLUICE_TOOLS_EVAL_METRICS_H_
#define SLUICE_TOOLS_EVAL_METRICS_H_

#include <cstdint>

namespace sluice::tools {

struct TokenMetrics {
  double nll = 0;      // -log p(target) under the tested logits
  double nll_ref = 0;  // -log p(target) under the reference logits
  double kl = 0;       // KL(reference || tested) of the two next-token distributions, nats
  bool top1 = false;   // both put their largest logit on the same token
};

// logits, ref_logits: [vocab]; target in [0, vocab).
TokenMetrics CompareLogits(const float* logits, const float* ref_logits, int64_t vocab,
                           int32_t target);

// Sums of TokenMetrics over many predictions.
class EvalTotals {
 public:
  void Add(const TokenMetrics& m);
  int64_t count() const { return count_; }
  double ppl() const;      // exp(mean nll)
  double ppl_ref() const;  // exp(mean nll_ref)
  double kl() const;       // mean KL
  double top1() const;     // fraction of agreeing predictions

 private:
  int64_t count_ = 0, top1_ = 0;
  double nll_ = 0, nll_ref_ = 0, kl_ = 0;
};

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_EVAL_METRICS_H_
