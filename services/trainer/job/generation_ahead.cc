#include "services/trainer/job/generation_ahead.h"

#include <algorithm>

namespace tandem::trainer {

GenerationAhead::~GenerationAhead() {
  if (ahead_.empty()) return;
  abandon_();
  for (Ahead& pending : ahead_) pending.samples.wait();
}

GenerationAhead::Taken GenerationAhead::Take(int64_t step, int64_t version) {
  if (ahead_.empty() || ahead_.front().step != step) {
    return {.samples = generate_(step, version), .version = version};
  }
  Taken taken{.samples = ahead_.front().samples.get(), .version = ahead_.front().version};
  ahead_.pop_front();
  return taken;
}

void GenerationAhead::StartAfter(int64_t step, int64_t version) {
  const int64_t last = std::min(step + lookahead_, last_step_);
  for (int64_t next = ahead_.empty() ? step + 1 : ahead_.back().step + 1; next <= last; ++next) {
    ahead_.push_back({next, version,
                      std::async(std::launch::async, [this, next, version, held = hold_(version)] {
                        return generate_(next, version);
                      })});
  }
}

}  // namespace tandem::trainer
