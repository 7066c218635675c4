#include "engine/peft_adapter.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json_file.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem::engine {
namespace {

// File and key names as PEFT defines them (peft/utils/constants.py, peft/utils/save_and_load.py).
constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";
constexpr char kPrefix[] = "base_model.model.";

// A side shared by all experts: ".mlp.experts.<module>.lora_<A|B>.weight", no expert index.
const std::regex& SharedExpertSide() {
  static const auto* pattern =
      new std::regex(R"(^(.*\.mlp\.experts\.)((gate|up|down)_proj\.lora_[AB]\.weight)$)");
  return *pattern;
}

absl::Status Invalid(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(kConfigFile, " ", key, ": ", why));
}

nlohmann::json PeftConfig(const LoraConfig& lora, const std::string& base_model,
                          const MoeModuleNames& names) {
  std::vector<std::string> target_modules;
  for (const std::string& target : lora.targets) target_modules.push_back(names.Module(target));
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base_model},
          {"r", lora.rank},
          {"lora_alpha", lora.alpha},
          {"target_modules", target_modules},
          {"lora_dropout", 0.0},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"use_rslora", false},
          {"use_dora", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()}};
}

// What PEFT would compute differently from LoraConfig{r, lora_alpha, target_modules}.
absl::StatusOr<LoraConfig> LoraConfigFromPeft(const nlohmann::json& config,
                                              const MoeModuleNames& names) {
  if (config.value("peft_type", "") != "LORA") return Invalid("peft_type", "must be \"LORA\"");
  for (const char* flag : {"use_rslora", "use_dora", "fan_in_fan_out"}) {
    if (config.value(flag, false)) return Invalid(flag, "true is not supported");
  }
  if (config.value("bias", "none") != "none") return Invalid("bias", "only \"none\"");
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    if (config.contains(pattern) && !config[pattern].is_null() && !config[pattern].empty()) {
      return Invalid(pattern, "per-module ranks or alphas are not supported");
    }
  }
  if (!config.contains("target_modules") || !config["target_modules"].is_array()) {
    return Invalid("target_modules", "must be a list of module names (not a regex)");
  }
  LoraConfig lora;
  lora.rank = config.at("r").get<int>();
  lora.alpha = config.at("lora_alpha").get<float>();
  lora.targets.clear();
  for (const std::string& module : config["target_modules"].get<std::vector<std::string>>()) {
    lora.targets.push_back(names.EngineModule(module));
  }
  lora.expert_layout = ExpertLayout::kPerExpert;
  if (absl::Status status = lora.Validate(); !status.ok()) {
    return Invalid("r/lora_alpha/target_modules", status.message());
  }
  return lora;
}

// Canonical tensors under PEFT names, shared expert sides copied to every expert.
std::map<std::string, Tensor> PeftTensors(const std::map<std::string, Tensor>& canonical,
                                          int num_experts, const MoeModuleNames& names) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, tensor] : canonical) {
    std::smatch shared;
    if (!std::regex_match(name, shared, SharedExpertSide())) {
      tensors[kPrefix + names.FromCanonical(name)] = tensor;
      continue;
    }
    for (int expert = 0; expert < num_experts; ++expert) {
      const std::string per_expert = absl::StrCat(shared[1].str(), expert, ".", shared[2].str());
      tensors[kPrefix + names.FromCanonical(per_expert)] = tensor;
    }
  }
  return tensors;
}

}  // namespace

absl::Status WritePeftAdapter(const LoraAdapter& adapter, const std::string& directory,
                              const std::string& base_model_name_or_path,
                              const MoeModuleNames& names) {
  return WritePeftDirectory(adapter.ToSafetensors().tensors, adapter.config(),
                            adapter.model_config().num_experts, directory, base_model_name_or_path,
                            names);
}

absl::Status WritePeftDirectory(const std::map<std::string, Tensor>& tensors,
                                const LoraConfig& lora, int num_experts,
                                const std::string& directory,
                                const std::string& base_model_name_or_path,
                                const MoeModuleNames& names) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", directory, ": ", error.message()));
  }
  absl::Status status =
      WriteSafetensors(absl::StrCat(directory, "/", kWeightsFile),
                       {PeftTensors(tensors, num_experts, names), {{"format", "pt"}}});
  if (!status.ok()) return status;
  const std::string config = PeftConfig(lora, base_model_name_or_path, names).dump(2);
  const std::string path = absl::StrCat(directory, "/", kConfigFile);
  const std::string temporary = path + ".tmp";
  if (!(std::ofstream(temporary) << config << "\n")) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", temporary));
  }
  std::filesystem::rename(temporary, path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

absl::StatusOr<LoraAdapter> ReadPeftAdapter(const std::string& directory,
                                            const ModelConfig& model_config,
                                            const MoeModuleNames& names) {
  const std::filesystem::path root(directory);
  auto config = ReadJsonObject((root / kConfigFile).string());
  if (!config.ok()) return config.status();
  absl::StatusOr<LoraConfig> lora = absl::InternalError("unset");
  try {
    lora = LoraConfigFromPeft(*config, names);
  } catch (const nlohmann::json::exception& error) {  // A key missing or of the wrong type.
    return Invalid("", error.what());
  }
  if (!lora.ok()) return lora.status();
  auto file = ReadSafetensors((root / kWeightsFile).string());
  if (!file.ok()) return file.status();
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, tensor] : file->tensors) {
    if (!absl::StartsWith(name, kPrefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWeightsFile, ": tensor ", name, " does not start with ", kPrefix));
    }
    auto converted = ConvertedToF32(tensor);
    if (!converted.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWeightsFile, ": tensor ", name, ": ", converted.status().message()));
    }
    tensors[names.ToCanonical(name.substr(sizeof(kPrefix) - 1))] = *std::move(converted);
  }
  auto adapter = LoraAdapter::FromTensors(tensors, model_config, *lora);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(),
                        absl::StrCat(directory, ": ", adapter.status().message()));
  }
  return adapter;
}

}  // namespace tandem::engine
