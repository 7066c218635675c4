#ifndef TANDEM_ENGINE_PEFT_ADAPTER_H_
#define TANDEM_ENGINE_PEFT_ADAPTER_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/module_names.h"

namespace tandem::engine {

// PEFT's on-disk LoRA adapter, which PeftModel.from_pretrained and vLLM's LoRA loader read:
//   DIR/adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "target_modules",
//                                   "base_model_name_or_path", ...}
//   DIR/adapter_model.safetensors  "base_model.model." + the module path + ".lora_A.weight"
//                                  [r, in] / ".lora_B.weight" [out, r], e.g.
//                                  base_model.model.model.layers.1.mlp.experts.3.up_proj.lora_B.weight
// Experts are always per expert there: an adapter whose layout shares a side between experts
// (shared, shared_outer) is written with that side copied to every expert, which computes the
// same function; it reads back in the per_expert layout. MoE modules are named as the base
// model's checkpoint names them (`names`, e.g. Mixtral's block_sparse_moe.experts.{e}.w1 and
// target_modules w1/w3/w2), since PEFT finds modules by those names.

// Writes `adapter` (F32) into `directory`, creating it; files are replaced atomically.
absl::Status WritePeftAdapter(const LoraAdapter& adapter, const std::string& directory,
                              const std::string& base_model_name_or_path,
                              const MoeModuleNames& names = {});

// The same from an adapter's canonical tensors (as LoraAdapter::ToSafetensors names them: a
// side shared between experts without an expert index) for a model of `num_experts` experts.
absl::Status WritePeftDirectory(const std::map<std::string, Tensor>& tensors,
                                const LoraConfig& lora, int num_experts,
                                const std::string& directory,
                                const std::string& base_model_name_or_path,
                                const MoeModuleNames& names = {});

// Reads a PEFT LoRA directory for a model of `model_config` (F32, BF16 or F16 tensors).
// INVALID_ARGUMENT naming the key for what would change the computation and is not supported
// (use_rslora, use_dora, bias other than "none", fan_in_fan_out, rank or alpha patterns,
// target_modules as a regex or outside q/k/v/o/gate/up/down_proj), and for a missing,
// unexpected or misshapen tensor (naming it); NOT_FOUND for a missing file.
absl::StatusOr<LoraAdapter> ReadPeftAdapter(const std::string& directory,
                                            const ModelConfig& model_config,
                                            const MoeModuleNames& names = {});

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_PEFT_ADAPTER_H_
