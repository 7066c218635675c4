#include "engine/cuda/device_engines.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/cpu_model_ops.h"
#include "engine/cuda/cuda_model_ops.h"
#include "engine/cuda/device_parameters.h"
#include "kernels/cuda/device.h"

namespace tandem::engine {

absl::Status ValidateDeviceName(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  return ::tandem::cuda::ParseCudaDevice(device).status();
}

namespace {

// `base` on GPU `ordinal`, for the engines there to share.
absl::StatusOr<std::shared_ptr<const cuda::DeviceParameters>> UploadBase(int ordinal,
                                                                         const BaseModel& base) {
  if (absl::Status status = ::tandem::cuda::SelectDevice(ordinal).status(); !status.ok()) {
    return status;
  }
  absl::StatusOr<cuda::DeviceParameters> uploaded =
      cuda::DeviceParameters::Upload(base.parameters());
  if (!uploaded.ok()) return uploaded.status();
  return std::make_shared<const cuda::DeviceParameters>(*std::move(uploaded));
}

}  // namespace

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
                                                    LoraAdapter& lora, ExpertExchange* exchange) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device == "cpu") {
    return TrainingEngines{
        .policy = std::make_unique<TransformerTrainingEngine>(
            base, &lora, std::make_unique<CpuModelOps>(base.config()), exchange),
        .reference = std::make_unique<TransformerTrainingEngine>(
            base, nullptr, std::make_unique<CpuModelOps>(base.config()), exchange)};
  }
  if (exchange != nullptr) {
    return absl::UnimplementedError(
        "expert parallelism on a GPU needs an all-to-all over device memory (NCCL), which the "
        "engine does not use yet: train expert-parallel jobs with --device=cpu");
  }
  const int ordinal = *::tandem::cuda::ParseCudaDevice(device);
  absl::StatusOr<std::shared_ptr<const cuda::DeviceParameters>> base_device =
      UploadBase(ordinal, base);
  if (!base_device.ok()) return base_device.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaModelOps>> policy =
      cuda::CudaModelOps::Create(base.config(), ordinal, base, *base_device, &lora);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaModelOps>> reference =
      cuda::CudaModelOps::Create(base.config(), ordinal, base, *base_device, nullptr);
  if (!reference.ok()) return reference.status();
  return TrainingEngines{
      .policy = std::make_unique<TransformerTrainingEngine>(base, &lora, *std::move(policy)),
      .reference =
          std::make_unique<TransformerTrainingEngine>(base, nullptr, *std::move(reference))};
}

absl::StatusOr<DecodeEngineMaker> MakeDecodeEngineMaker(const std::string& device,
                                                        Precision precision) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device == "cpu") {
    return DecodeEngineMaker(
        [precision](BaseModel& base,
                    LoraAdapter* lora) -> absl::StatusOr<std::unique_ptr<DecodeEngine>> {
          return std::make_unique<Transformer>(
              base, lora, std::make_unique<CpuModelOps>(base.config()), precision);
        });
  }
  if (precision != Precision::kF32 && precision != Precision::kBF16) {
    return absl::UnimplementedError(
        "on a GPU the engine computes in fp32 or bf16: use --precision=fp32 or bf16");
  }
  // The first engine made uploads the base model; every later one computes over that copy.
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
    if (shared->parameters == nullptr) {
      absl::StatusOr<std::shared_ptr<const cuda::DeviceParameters>> uploaded =
          UploadBase(ordinal, base);
      if (!uploaded.ok()) return uploaded.status();
      shared->parameters = *std::move(uploaded);
    }
    absl::StatusOr<std::unique_ptr<cuda::CudaModelOps>> ops =
        cuda::CudaModelOps::Create(base.config(), ordinal, base, shared->parameters, lora);
    if (!ops.ok()) return ops.status();
    return std::make_unique<Transformer>(base, lora, *std::move(ops), precision);
  });
}

}  // namespace tandem::engine
