#ifndef TANDEM_ENGINE_CUDA_DEVICE_ENGINES_H_
#define TANDEM_ENGINE_CUDA_DEVICE_ENGINES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/decode_engine.h"
#include "engine/expert_exchange.h"
#include "engine/model.h"
#include "engine/training_engine.h"

// Built with the CUDA toolkit, these make Transformers over the CUDA backend (CudaModelOps) for
// GPU devices; built without it
// (device_engines_without_cuda.cc, see third_party/cuda), CPU engines only.
namespace tandem::engine {

// The engines on `device`: "cpu", or "cuda" / "cuda:N" (both share one copy of the base model
// on that GPU). INVALID_ARGUMENT for another device name; FAILED_PRECONDITION without the GPU,
// RESOURCE_EXHAUSTED when the base model does not fit on it. What the CUDA backend cannot compute
// (latent attention, FP8 and INT8 emulation) its first pass refuses as UNIMPLEMENTED, naming it.
// Neither model is owned; both must outlive the engines.
// With an expert exchange (not owned; expert parallelism over host buffers), CPU engines only:
// UNIMPLEMENTED on a GPU.
absl::StatusOr<TrainingEngines> MakeTrainingEngines(const std::string& device, BaseModel& base,
                                                    LoraAdapter& lora,
                                                    ExpertExchange* exchange = nullptr);

// INVALID_ARGUMENT unless `device` is "cpu", "cuda" or "cuda:N" (no GPU is touched).
absl::Status ValidateDeviceName(const std::string& device);

// Whether a GPU can be used: built with CUDA and one is visible.
bool CudaDeviceVisible();

// What a service's --device flag names, checked at startup: "cpu", or the GPU's name;
// INVALID_ARGUMENT for a bad name, FAILED_PRECONDITION (saying why) for an unusable GPU.
absl::StatusOr<std::string> DescribeDevice(const std::string& device);

// A maker for `device`: Transformers of `precision` on the CPU, or over the CUDA backend on that
// GPU, all sharing one device copy of the base model (the first engine made uploads it).
// INVALID_ARGUMENT for a bad device name; UNIMPLEMENTED for FP8 or INT8 on a GPU.
absl::StatusOr<DecodeEngineMaker> MakeDecodeEngineMaker(const std::string& device,
                                                        Precision precision);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_CUDA_DEVICE_ENGINES_H_
