#include "engine/cuda/device_parameters.h"

#include "absl/strings/str_cat.h"

namespace tandem::engine::cuda {

using ::tandem::cuda::DeviceArray;

absl::StatusOr<DeviceParameters> DeviceParameters::Upload(const ParameterSet& parameters) {
  DeviceParameters device;
  for (const std::string& name : parameters.names()) {
    absl::StatusOr<DeviceArray<float>> tensor =
        DeviceArray<float>::FromHost(parameters.Find(name)->value);
    if (!tensor.ok()) {
      return absl::Status(tensor.status().code(),
                          absl::StrCat("uploading ", name, ": ", tensor.status().message()));
    }
    device.tensors_.emplace(name, *std::move(tensor));
  }
  return device;
}

absl::Status DeviceParameters::Refresh(const ParameterSet& parameters) {
  if (parameters.names().size() != tensors_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refresh with ", parameters.names().size(), " tensors of ", tensors_.size(), " uploaded"));
  }
  for (const std::string& name : parameters.names()) {
    const Parameter& parameter = *parameters.Find(name);
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.size() != parameter.value.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("refresh: ", name, " was not uploaded with this size"));
    }
    if (absl::Status status = ::tandem::cuda::CopyToDevice(
            it->second.data(), parameter.value.data(), parameter.value.size() * sizeof(float));
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceParameters::Zero() {
  for (auto& [name, tensor] : tensors_) {
    if (absl::Status status =
            ::tandem::cuda::ZeroDevice(tensor.data(), tensor.size() * sizeof(float));
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

float* DeviceParameters::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.data();
}

}  // namespace tandem::engine::cuda
