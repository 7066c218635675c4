// device_engines.h for builds without the CUDA toolkit (see third_party/cuda): every engine
// is a CPU one, and a GPU device is refused at once.

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu_model_ops.h"
#include "engine/cuda/device_engines.h"

namespace tandem::engine {
namespace {

absl::Status NoCuda(const std::string& device) {
  return absl::FailedPreconditionError(
      absl::StrCat("device ", device, ": this binary was built without CUDA (no nvcc)"));
}

}  // namespace

absl::Status ValidateDeviceName(const std::string& device) {
  int ordinal = 0;
  if (device == "cpu" || device == "cuda" ||
      (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &ordinal) &&
       ordinal >= 0)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not \"cpu\", \"cuda\" or \"cuda:N\""));
}

bool CudaDeviceVisible() { return false; }

absl::StatusOr<std::string> DescribeDevice(const std::string& device) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device != "cpu") return NoCuda(device);
  return device;
}

absl::StatusOr<TrainingEngines> MakeTrainingEngines(const std::string& device, BaseModel& base,
                                                    LoraAdapter& lora, ExpertExchange* exchange) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device != "cpu") return NoCuda(device);
  return TrainingEngines{
      .policy = std::make_unique<TransformerTrainingEngine>(
          base, &lora, std::make_unique<CpuModelOps>(base.config()), exchange),
      .reference = std::make_unique<TransformerTrainingEngine>(
          base, nullptr, std::make_unique<CpuModelOps>(base.config()), exchange)};
}

absl::StatusOr<DecodeEngineMaker> MakeDecodeEngineMaker(const std::string& device,
                                                        Precision precision) {
  if (absl::Status status = ValidateDeviceName(device); !status.ok()) return status;
  if (device != "cpu" && precision != Precision::kF32 && precision != Precision::kBF16) {
    return absl::UnimplementedError("on a GPU the engine computes in fp32 or bf16");
  }
  if (device != "cpu") return NoCuda(device);
  return DecodeEngineMaker(
      [precision](BaseModel& base,
                  LoraAdapter* lora) -> absl::StatusOr<std::unique_ptr<DecodeEngine>> {
        return std::make_unique<Transformer>(
            base, lora, std::make_unique<CpuModelOps>(base.config()), precision);
      });
}

}  // namespace tandem::engine
