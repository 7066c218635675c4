#include "engine/cuda/device_engines.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/cuda/cuda_transformer.h"
#include "kernels/cuda/device.h"

namespace tandem::engine {

absl::Status ValidateDeviceName(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  return ::tandem::cuda::ParseCudaDevice(device).status();
}

bool CudaDeviceVisible() { return ::tandem::cuda::VisibleDeviceCount() > 0; }

absl::StatusOr<std::string> DescribeDevice(const std::string& device) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device == "cpu") return device;
  absl::StatusOr<::tandem::cuda::DeviceInfo> gpu =
      ::tandem::cuda::SelectDevice(*::tandem::cuda::ParseCudaDevice(device));
  if (!gpu.ok()) return absl::FailedPreconditionError(gpu.status().message());
  return absl::StrCat(device, " (", gpu->name, ")");
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
      cuda::CudaTransformer::Create(base, &lora, {.device = ordinal});
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaTransformer>> reference =
      cuda::CudaTransformer::Create(base, nullptr, {.device = ordinal, .base = (*policy)->base()});
  if (!reference.ok()) return reference.status();
  return TrainingEngines{.policy = *std::move(policy), .reference = *std::move(reference)};
}

absl::StatusOr<DecodeEngineMaker> MakeDecodeEngineMaker(const std::string& device,
                                                        Precision precision) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device == "cpu") {
    return DecodeEngineMaker(
        [precision](BaseModel& base,
                    LoraAdapter* lora) -> absl::StatusOr<std::unique_ptr<DecodeEngine>> {
          return std::make_unique<Transformer>(base, lora, precision);
        });
  }
  if (precision != Precision::kF32 && precision != Precision::kBF16) {
    return absl::UnimplementedError(
        "on a GPU the engine computes in fp32 or bf16: use --precision=fp32 or bf16");
  }
  struct SharedBase {
    absl::Mutex mutex;
    std::shared_ptr<const cuda::DeviceParameters> parameters ABSL_GUARDED_BY(mutex);
  };
  auto shared = std::make_shared<SharedBase>();
  const int ordinal = *::tandem::cuda::ParseCudaDevice(device);
  return DecodeEngineMaker([shared, ordinal, precision](
                               BaseModel& base,
                               LoraAdapter* lora) -> absl::StatusOr<std::unique_ptr<DecodeEngine>> {
    absl::MutexLock lock(&shared->mutex);
    absl::StatusOr<std::unique_ptr<cuda::CudaTransformer>> engine = cuda::CudaTransformer::Create(
        base, lora, {.device = ordinal, .precision = precision, .base = shared->parameters});
    if (!engine.ok()) return engine.status();
    shared->parameters = (*engine)->base();
    return std::unique_ptr<DecodeEngine>(*std::move(engine));
  });
}

}  // namespace tandem::engine
