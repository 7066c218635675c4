#ifndef TANDEM_SERVICES_ROLLOUT_SERVED_MODEL_H_
#define TANDEM_SERVICES_ROLLOUT_SERVED_MODEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "engine/decode_engine.h"
#include "engine/model.h"

namespace tandem::rollout {

// Something samples can be generated with: the base model (adapter "", version 0) or one adapter
// version over it. Immutable once servable; samples hold a shared_ptr, so a version retired from
// the registry lives until its last sample finishes.
struct ServedModel {
  std::string adapter;
  int64_t version = 0;
  std::unique_ptr<engine::LoraAdapter> lora;     // Null for the base model.
  std::unique_ptr<engine::DecodeEngine> engine;  // Over the base model and `lora`.
  absl::Time ready_time;
  std::atomic<int> active_samples{0};
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_SERVED_MODEL_H_
