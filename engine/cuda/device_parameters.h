#ifndef TANDEM_ENGINE_CUDA_DEVICE_PARAMETERS_H_
#define TANDEM_ENGINE_CUDA_DEVICE_PARAMETERS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/parameters.h"
#include "kernels/cuda/device.h"

namespace tandem::engine::cuda {

// A ParameterSet's values in device memory, under the same names. The host set stays the
// source of truth (checkpoints, publishing); Upload copies it again after it changed (a refit).
class DeviceParameters {
 public:
  // Allocates and copies every parameter; RESOURCE_EXHAUSTED with the size asked when the GPU
  // is full.
  static absl::StatusOr<DeviceParameters> Upload(const ParameterSet& parameters);
  // Copies `parameters`' values into the existing device tensors; FAILED_PRECONDITION unless
  // it holds the same names and sizes.
  absl::Status Refresh(const ParameterSet& parameters);

  // Sets every tensor to zero (gradients before a backward pass).
  absl::Status Zero();

  // The device copy of `name`, or null when there is none.
  float* Find(const std::string& name) const;

 private:
  std::map<std::string, ::tandem::cuda::DeviceArray<float>> tensors_;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_DEVICE_PARAMETERS_H_
