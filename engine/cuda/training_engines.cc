#include "engine/cuda/training_engines.h"

#include "engine/cuda/cuda_transformer.h"
#include "kernels/cuda/device.h"

namespace tandem::engine {

absl::Status ValidateDeviceName(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  return ::tandem::cuda::ParseCudaDevice(device).status();
}

absl::StatusOr<TrainingEngines> MakeTrainingEngines(const std::string& device, BaseModel& base,
                                                    LoraAdapter& lora) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device == "cpu") {
    return TrainingEngines{.policy = std::make_unique<CpuTrainingEngine>(base, &lora),
                           .reference = std::make_unique<CpuTrainingEngine>(base, nullptr)};
  }
  const int ordinal = *::tandem::cuda::ParseCudaDevice(device);
  absl::StatusOr<std::unique_ptr<cuda::CudaTransformer>> policy =
      cuda::CudaTransformer::Create(base, &lora, ordinal);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaTransformer>> reference =
      cuda::CudaTransformer::Create(base, nullptr, ordinal, (*policy)->base());
  if (!reference.ok()) return reference.status();
  return TrainingEngines{.policy = *std::move(policy), .reference = *std::move(reference)};
}

}  // namespace tandem::engine
