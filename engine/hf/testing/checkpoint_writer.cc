#include "engine/hf/testing/checkpoint_writer.h"

#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/safetensors.h"

namespace tandem::engine::hf::testing {
namespace {

absl::Status WriteJson(const std::string& path, const nlohmann::json& json) {
  if (!(std::ofstream(path) << json.dump(2))) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& directory, const nlohmann::json& config,
                             std::map<std::string, Tensor> tensors, int shards) {
  if (absl::Status status = WriteJson(directory + "/config.json", config); !status.ok()) {
    return status;
  }
  if (shards == 1) return WriteSafetensors(directory + "/model.safetensors", {tensors, {}});
  std::vector<SafetensorsFile> files(shards);
  nlohmann::json weight_map;
  const int per_shard = (static_cast<int>(tensors.size()) + shards - 1) / shards;
  int index = 0;
  for (auto& [name, tensor] : tensors) {
    const int shard = index++ / per_shard;
    weight_map[name] = absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, shards);
    files[shard].tensors[name] = std::move(tensor);
  }
  for (int shard = 0; shard < shards; ++shard) {
    const std::string path =
        absl::StrFormat("%s/model-%05d-of-%05d.safetensors", directory, shard + 1, shards);
    if (absl::Status status = WriteSafetensors(path, files[shard]); !status.ok()) return status;
  }
  return WriteJson(directory + "/model.safetensors.index.json", {{"weight_map", weight_map}});
}

}  // namespace tandem::engine::hf::testing
