#include "engine/hf/hf_checkpoint.h"

#include <filesystem>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_file.h"
#include "common/safetensors.h"

namespace tandem::engine::hf {
namespace {

constexpr char kConfigFile[] = "config.json";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// Shard file -> the tensors the index puts in it.
using ShardPlan = std::map<std::string, std::vector<std::string>>;

absl::StatusOr<ShardPlan> PlanFromIndex(const std::filesystem::path& index_path) {
  auto index = ReadJsonObject(index_path.string());
  if (!index.ok()) return index.status();
  if (!index->contains("weight_map") || !(*index)["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), " has no weight_map"));
  }
  ShardPlan plan;
  for (const auto& [name, shard] : (*index)["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor ", name,
                                                     " maps to ", shard.dump(),
                                                     ", not a file name in the directory"));
    }
    plan[shard.get<std::string>()].push_back(name);
  }
  return plan;
}

std::string Some(const std::vector<std::string>& names) {
  constexpr size_t kShown = 3;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  return absl::StrCat(
      absl::StrJoin(shown, ", "),
      names.size() > kShown ? absl::StrCat(" and ", names.size() - kShown, " more") : "");
}

absl::Status ReadShard(const std::filesystem::path& path, const std::vector<std::string>& planned,
                       bool sharded, std::map<std::string, Tensor>& tensors) {
  auto shard = ReadSafetensors(path.string());
  if (!shard.ok()) {
    const std::string holds = sharded ? absl::StrCat(" (it should hold ", Some(planned), ")") : "";
    return absl::Status(shard.status().code(), absl::StrCat(shard.status().message(), holds));
  }
  for (const std::string& name : planned) {
    if (!shard->tensors.contains(name)) {
      return absl::DataLossError(absl::StrCat("tensor ", name, " is listed in ", kIndexFile,
                                              " under ", path.filename().string(),
                                              ", which does not hold it"));
    }
  }
  const absl::flat_hash_set<std::string> assigned(planned.begin(), planned.end());
  for (auto& [name, tensor] : shard->tensors) {
    if (sharded && !assigned.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(path.filename().string(), " holds tensor ",
                                                     name, ", which ", kIndexFile,
                                                     " does not assign to it"));
    }
    auto converted = ConvertedToF32(tensor);
    if (!converted.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ",
                                                     converted.status().message(),
                                                     "; weights must be F32, BF16 or F16"));
    }
    tensors[name] = *std::move(converted);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfCheckpoint> ReadHfCheckpoint(const std::string& directory) {
  const std::filesystem::path root(directory);
  HfCheckpoint checkpoint;
  auto config = ReadJsonObject((root / kConfigFile).string());
  if (!config.ok()) return config.status();
  checkpoint.config = *std::move(config);
  const bool sharded = std::filesystem::exists(root / kIndexFile);
  ShardPlan plan{{kSingleFile, {}}};
  if (sharded) {
    auto from_index = PlanFromIndex(root / kIndexFile);
    if (!from_index.ok()) return from_index.status();
    plan = *std::move(from_index);
  } else if (!std::filesystem::exists(root / kSingleFile)) {
    return absl::NotFoundError(
        absl::StrCat(directory, " has neither ", kSingleFile, " nor ", kIndexFile));
  }
  for (const auto& [shard, names] : plan) {
    absl::Status status = ReadShard(root / shard, names, sharded, checkpoint.tensors);
    if (!status.ok()) return status;
  }
  return checkpoint;
}

absl::Status CheckTensorShapes(const HfCheckpoint& checkpoint, const TensorShapes& expected) {
  for (const auto& [name, shape] : expected) {
    const auto found = checkpoint.tensors.find(name);
    if (found == checkpoint.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint lacks tensor ", name));
    }
    if (found->second.shape() != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(found->second.shape(), ","),
                       "]; the config makes it [", absl::StrJoin(shape, ","), "]"));
    }
  }
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint holds tensor ", name,
                                                     ", which the architecture has no place for"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine::hf
