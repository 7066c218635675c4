#include "services/trainer/update/forward_backward.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {

absl::StatusOr<double> ForwardBackward(engine::TrainingEngine& engine, const ScoredSequences& batch,
                                       TokenLossFunction loss) {
  absl::StatusOr<std::vector<float>> logp =
      engine.ForwardLogProbs(*batch.sequences, batch.routes, *batch.targets, batch.temperature);
  if (!logp.ok()) return logp.status();
  absl::StatusOr<TokenLoss> computed = loss(*logp);
  if (!computed.ok()) return computed.status();
  if (computed->dlogp.size() != logp->size()) {
    return InvalidRequest("BAD_LOSS_GRADIENT",
                          absl::StrCat("the loss's gradient has ", computed->dlogp.size(),
                                       " log-probs for ", logp->size(), " positions"));
  }
  if (!computed->dhidden.empty() && computed->dhidden.size() != engine.final_hidden().size()) {
    return InvalidRequest(
        "BAD_LOSS_GRADIENT",
        absl::StrCat("the loss's hidden-state gradient has ", computed->dhidden.size(),
                     " floats; the ", "forward's hidden states have ",
                     engine.final_hidden().size()));
  }
  if (absl::Status status = engine.BackwardLogProbs(
          computed->dlogp.data(), computed->dhidden.empty() ? nullptr : computed->dhidden.data());
      !status.ok()) {
    return status;
  }
  return computed->value;
}

}  // namespace tandem::trainer
