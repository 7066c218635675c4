#ifndef TANDEM_ENGINE_CUDA_TRAINING_ENGINES_H_
#define TANDEM_ENGINE_CUDA_TRAINING_ENGINES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/training_engine.h"

namespace tandem::engine {

// The engines on `device`: "cpu", or "cuda" / "cuda:N" (both share one copy of the base model
// on that GPU). INVALID_ARGUMENT for another device name; a GPU's errors (none visible, out of
// memory, unsupported architecture or model) as CudaTransformer::Create reports them.
// Neither model is owned; both must outlive the engines.
absl::StatusOr<TrainingEngines> MakeTrainingEngines(const std::string& device, BaseModel& base,
                                                    LoraAdapter& lora);

// INVALID_ARGUMENT unless `device` is "cpu", "cuda" or "cuda:N" (no GPU is touched).
absl::Status ValidateDeviceName(const std::string& device);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_CUDA_TRAINING_ENGINES_H_
