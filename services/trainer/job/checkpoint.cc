#include "services/trainer/job/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/safetensors.h"

namespace tandem::trainer {
namespace {

constexpr char kFile[] = "checkpoint.safetensors";
constexpr char kLora[] = "lora/";
constexpr char kOptimizer[] = "optimizer/";
constexpr char kCriticHead[] = "critic/head/";
constexpr char kCriticOptimizer[] = "critic/optimizer/";
constexpr char kCriticOptimizerStep[] = "tandem.critic_optimizer_step";
constexpr char kStep[] = "tandem.step";
constexpr char kVersion[] = "tandem.policy_version";
constexpr char kOptimizerStep[] = "tandem.optimizer_step";
constexpr char kJobId[] = "tandem.job_id";
constexpr char kSpecFingerprint[] = "tandem.spec_fingerprint";
constexpr char kInitializedFrom[] = "tandem.initialized_from";
// Per tensor, the XXH3-64 of its bytes: "tandem.xxh3.<tensor name>" -> 16 hex digits.
constexpr char kChecksumPrefix[] = "tandem.xxh3.";

uint64_t TensorChecksum(const Tensor& tensor) { return Xxh3Checksum(tensor.bytes()); }

// Every tensor's bytes against the checksum written with it: a flipped bit in an AdamW moment
// must not resume silently.
absl::Status VerifyChecksums(const SafetensorsFile& file, const std::string& path) {
  const bool written_with_checksums =
      std::any_of(file.metadata.begin(), file.metadata.end(),
                  [](const auto& entry) { return entry.first.starts_with(kChecksumPrefix); });
  if (!written_with_checksums) {
    spdlog::warn("checkpoint {} predates tensor checksums; loading it unverified", path);
    return absl::OkStatus();
  }
  for (const auto& [name, tensor] : file.tensors) {
    auto written = file.metadata.find(kChecksumPrefix + name);
    if (written == file.metadata.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, ": tensor ", name, " has no checksum"));
    }
    if (written->second != ChecksumToHex(TensorChecksum(tensor))) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, ": tensor ", name, " is corrupt (xxh3 ",
                       ChecksumToHex(TensorChecksum(tensor)), ", written ", written->second, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> IntMetadata(const std::map<std::string, std::string>& metadata,
                                    const std::string& key) {
  auto found = metadata.find(key);
  int64_t value = 0;
  if (found == metadata.end() || !absl::SimpleAtoi(found->second, &value)) {
    return absl::DataLossError(absl::StrCat("checkpoint metadata '", key, "' missing or bad"));
  }
  return value;
}

std::string StringMetadata(const std::map<std::string, std::string>& metadata,
                           const std::string& key) {
  auto found = metadata.find(key);
  return found == metadata.end() ? "" : found->second;
}

CheckpointOwner OwnerOf(const std::map<std::string, std::string>& metadata) {
  return {.job_id = StringMetadata(metadata, kJobId),
          .spec_fingerprint = StringMetadata(metadata, kSpecFingerprint),
          .initialized_from = StringMetadata(metadata, kInitializedFrom)};
}

// Writes `tensors` as 1-D F32 tensors named prefix + name.
absl::Status AddF32Tensors(const char* prefix,
                           const std::map<std::string, std::vector<float>>& tensors,
                           SafetensorsFile& file) {
  for (const auto& [name, values] : tensors) {
    auto tensor =
        Tensor::FromBytes(DType::kF32, {static_cast<int64_t>(values.size())},
                          absl::MakeConstSpan(reinterpret_cast<const std::byte*>(values.data()),
                                              values.size() * sizeof(float)));
    if (!tensor.ok()) return tensor.status();
    file.tensors[prefix + name] = *std::move(tensor);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, const CheckpointOwner& owner, int64_t step,
                            int64_t policy_version, const engine::LoraAdapter& lora,
                            const engine::AdamWState& optimizer, const CriticState* critic) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  SafetensorsFile adapter = lora.ToSafetensors();
  SafetensorsFile file;
  file.metadata = adapter.metadata;
  for (auto& [name, tensor] : adapter.tensors) file.tensors[kLora + name] = std::move(tensor);
  if (absl::Status status = AddF32Tensors(kOptimizer, optimizer.tensors, file); !status.ok()) {
    return status;
  }
  if (critic != nullptr) {
    for (const auto& [prefix, tensors] :
         {std::pair{kCriticHead, &critic->head},
          std::pair{kCriticOptimizer, &critic->optimizer.tensors}}) {
      if (absl::Status status = AddF32Tensors(prefix, *tensors, file); !status.ok()) return status;
    }
    file.metadata[kCriticOptimizerStep] = absl::StrCat(critic->optimizer.step);
  }
  file.metadata[kJobId] = owner.job_id;
  file.metadata[kSpecFingerprint] = owner.spec_fingerprint;
  if (!owner.initialized_from.empty()) file.metadata[kInitializedFrom] = owner.initialized_from;
  file.metadata[kStep] = absl::StrCat(step);
  file.metadata[kVersion] = absl::StrCat(policy_version);
  file.metadata[kOptimizerStep] = absl::StrCat(optimizer.step);
  for (const auto& [name, tensor] : file.tensors) {
    file.metadata[kChecksumPrefix + name] = ChecksumToHex(TensorChecksum(tensor));
  }
  return WriteSafetensors(absl::StrCat(dir, "/", kFile), file);
}

absl::StatusOr<std::optional<Checkpoint>> LoadCheckpoint(const std::string& dir,
                                                         const engine::ModelConfig& model) {
  const std::string path = absl::StrCat(dir, "/", kFile);
  if (!std::filesystem::exists(path)) return std::nullopt;
  auto file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  if (absl::Status status = VerifyChecksums(*file, path); !status.ok()) return status;
  SafetensorsFile adapter;
  adapter.metadata = file->metadata;
  engine::AdamWState optimizer;
  CriticState critic;
  bool has_critic = false;
  for (auto& [name, tensor] : file->tensors) {
    if (name.starts_with(kLora)) {
      adapter.tensors[name.substr(std::strlen(kLora))] = std::move(tensor);
      continue;
    }
    for (const auto& [prefix, tensors] :
         {std::pair{kOptimizer, &optimizer.tensors}, std::pair{kCriticHead, &critic.head},
          std::pair{kCriticOptimizer, &critic.optimizer.tensors}}) {
      if (!name.starts_with(prefix)) continue;
      auto values = tensor.data<float>();
      if (!values.ok()) return values.status();
      (*tensors)[name.substr(std::strlen(prefix))].assign(values->begin(), values->end());
      has_critic = has_critic || tensors != &optimizer.tensors;
    }
  }
  auto lora = engine::LoraAdapter::FromSafetensors(adapter, model);
  if (!lora.ok()) return lora.status();
  auto step = IntMetadata(file->metadata, kStep);
  auto version = IntMetadata(file->metadata, kVersion);
  auto optimizer_step = IntMetadata(file->metadata, kOptimizerStep);
  for (const auto* value : {&step, &version, &optimizer_step}) {
    if (!value->ok()) return value->status();
  }
  optimizer.step = *optimizer_step;
  Checkpoint checkpoint{OwnerOf(file->metadata), *step, *version, *std::move(lora),
                        std::move(optimizer)};
  if (has_critic) {
    auto critic_step = IntMetadata(file->metadata, kCriticOptimizerStep);
    if (!critic_step.ok()) return critic_step.status();
    critic.optimizer.step = *critic_step;
    checkpoint.critic = std::move(critic);
  }
  return checkpoint;
}

absl::StatusOr<std::optional<CheckpointSummary>> ReadCheckpointSummary(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kFile);
  if (!std::filesystem::exists(path)) return std::nullopt;
  auto metadata = ReadSafetensorsMetadata(path);
  if (!metadata.ok()) return metadata.status();
  auto step = IntMetadata(*metadata, kStep);
  if (!step.ok()) return step.status();
  return CheckpointSummary{OwnerOf(*metadata), *step};
}

}  // namespace tandem::trainer
