#ifndef TANDEM_ENGINE_HF_HF_MODEL_H_
#define TANDEM_ENGINE_HF_HF_MODEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace tandem::engine::hf {

// The engine model of a Hugging Face model directory (config.json and model.safetensors or
// its shards): the architecture read from config.json (HfArchitectureFromConfig), every
// tensor checked by name and shape, converted to F32 once and renamed to the engine's
// canonical names. Errors name the directory and the tensor or field.
absl::StatusOr<BaseModel> LoadHfModel(const std::string& directory);

// The base model at `path`, in either format: a Hugging Face model directory, or a
// safetensors file written by the engine (BaseModel::Save, make_base_model). What every
// `base_model_path` and `--base_model` takes.
absl::StatusOr<BaseModel> LoadBaseModel(const std::string& path);

// The architecture of the base model at `path` (config.json "architectures", e.g.
// "MixtralForCausalLM"), "" for an engine file: what says how its PEFT adapters name modules.
absl::StatusOr<std::string> BaseModelArchitecture(const std::string& path);

}  // namespace tandem::engine::hf

#endif  // TANDEM_ENGINE_HF_HF_MODEL_H_
