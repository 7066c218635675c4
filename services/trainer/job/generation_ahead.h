#ifndef TANDEM_SERVICES_TRAINER_GENERATION_AHEAD_H_
#define TANDEM_SERVICES_TRAINER_GENERATION_AHEAD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>

#include "absl/status/statusor.h"
#include "services/trainer/step/step_sampler.h"

namespace tandem::trainer {

// ASYNC generation: the samples of the steps after the current one, generated while it trains,
// each by the newest version published when its generation starts. A step so trains on samples at
// most `lookahead` versions behind; mismatch weights correct for it. With lookahead 0 (SYNC) every
// step generates when it is taken.
class GenerationAhead {
 public:
  using Generate = std::function<absl::StatusOr<StepSamples>(int64_t step, int64_t version)>;
  // A hold on `version` (a weight-store pin) kept until its step takes the samples: publishing
  // ahead must not retire the version under a retry of the generation.
  using Hold = std::function<std::shared_ptr<void>(int64_t version)>;

  // `abandon` cancels the generations in flight; steps run up to `last_step`.
  GenerationAhead(Generate generate, Hold hold, std::function<void()> abandon, int64_t lookahead,
                  int64_t last_step)
      : generate_(std::move(generate)),
        hold_(std::move(hold)),
        abandon_(std::move(abandon)),
        lookahead_(lookahead),
        last_step_(last_step) {}
  // Leaving early (cancel, error) does not wait out generations nobody will take: abandons them.
  ~GenerationAhead();

  struct Taken {
    absl::StatusOr<StepSamples> samples;
    int64_t version = 0;  // The version that generated them.
  };
  // `step`'s samples: those generated ahead when there are, else generated now by `version`.
  Taken Take(int64_t step, int64_t version);
  // Starts generating, by `version`, the steps after `step` within the lookahead not yet started.
  void StartAfter(int64_t step, int64_t version);

 private:
  struct Ahead {
    int64_t step;
    int64_t version;
    std::future<absl::StatusOr<StepSamples>> samples;
  };

  const Generate generate_;
  const Hold hold_;
  const std::function<void()> abandon_;
  const int64_t lookahead_;
  const int64_t last_step_;
  std::deque<Ahead> ahead_;  // Ascending steps.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_GENERATION_AHEAD_H_
