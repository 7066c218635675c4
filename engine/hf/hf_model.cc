#include "engine/hf/hf_model.h"

#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/json_file.h"
#include "engine/hf/hf_architecture.h"
#include "engine/hf/hf_checkpoint.h"

namespace tandem::engine::hf {
namespace {

// Drops the tensors of layers `first` and beyond.
void DropLayersFrom(int first, std::map<std::string, Tensor>& tensors) {
  constexpr absl::string_view kLayers = "model.layers.";
  std::erase_if(tensors, [&](const auto& entry) {
    absl::string_view name = entry.first;
    int layer = 0;
    return absl::ConsumePrefix(&name, kLayers) &&
           absl::SimpleAtoi(name.substr(0, name.find('.')), &layer) && layer >= first;
  });
}

absl::Status InDirectory(const std::string& directory, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("'", directory, "': ", status.message()));
}

}  // namespace

absl::StatusOr<BaseModel> LoadHfModel(const std::string& directory) {
  auto checkpoint = ReadHfCheckpoint(directory);
  if (!checkpoint.ok()) return checkpoint.status();
  auto architecture = HfArchitectureFromConfig(checkpoint->config);
  if (!architecture.ok()) return InDirectory(directory, architecture.status());
  if (architecture->ignores_extra_layers) {
    DropLayersFrom(architecture->config.num_layers, checkpoint->tensors);
  }
  const TensorShapes expected = HfTensorShapes(*architecture);
  if (absl::Status status = CheckTensorShapes(*checkpoint, expected); !status.ok()) {
    return InDirectory(directory, status);
  }
  SafetensorsFile canonical;
  for (auto& [name, tensor] : checkpoint->tensors) {
    canonical.tensors[architecture->names.ToCanonical(name)] = std::move(tensor);
  }
  auto model = BaseModel::FromTensors(architecture->config, canonical);
  if (!model.ok()) return InDirectory(directory, model.status());
  return model;
}

absl::StatusOr<BaseModel> LoadBaseModel(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return LoadHfModel(path);
  return BaseModel::Load(path);
}

absl::StatusOr<std::string> BaseModelArchitecture(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) return "";
  auto config = ReadJsonObject((std::filesystem::path(path) / "config.json").string());
  if (!config.ok()) return config.status();
  auto architecture = HfArchitectureFromConfig(*config);
  if (!architecture.ok()) return InDirectory(path, architecture.status());
  return architecture->name;
}

}  // namespace tandem::engine::hf
