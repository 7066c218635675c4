#ifndef TANDEM_ENGINE_MODULE_NAMES_H_
#define TANDEM_ENGINE_MODULE_NAMES_H_

#include <array>
#include <string>

#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

// How a model family names its MoE modules where that differs from the engine's canonical
// names (model.layers.{l}.mlp.gate and mlp.experts.{e}.{gate,up,down}_proj): Mixtral's
// block_sparse_moe with w1/w3/w2. Checkpoints (engine/hf) and PEFT adapters are named so.
struct MoeModuleNames {
  std::string block = "mlp";
  std::array<std::string, 3> projections = {"gate_proj", "up_proj", "down_proj"};

  // A canonical tensor name (base weight or LoRA side) in this naming, and back.
  std::string FromCanonical(const std::string& name) const { return Renamed(name, false); }
  std::string ToCanonical(const std::string& name) const { return Renamed(name, true); }
  // An engine module ("q_proj", "gate_proj", ...) as this naming calls it, and back.
  std::string Module(absl::string_view engine_module) const {
    for (size_t i = 0; i < 3; ++i) {
      if (engine_module == kCanonical[i]) return projections[i];
    }
    return std::string(engine_module);
  }
  std::string EngineModule(absl::string_view module) const {
    for (size_t i = 0; i < 3; ++i) {
      if (module == projections[i]) return kCanonical[i];
    }
    return std::string(module);
  }

 private:
  static constexpr const char* kCanonical[3] = {"gate_proj", "up_proj", "down_proj"};

  std::string Renamed(const std::string& name, bool to_canonical) const {
    const std::string canonical_block = ".mlp.", own_block = "." + block + ".";
    const std::string& from_block = to_canonical ? own_block : canonical_block;
    const std::string& to_block = to_canonical ? canonical_block : own_block;
    if (name.find(from_block + "gate.") == std::string::npos &&
        name.find(from_block + "experts.") == std::string::npos) {
      return name;  // Not an MoE tensor: attention, norms, dense MLPs keep their names.
    }
    std::string renamed = absl::StrReplaceAll(name, {{from_block, to_block}});
    for (size_t i = 0; i < 3; ++i) {
      const std::string from =
          "." + (to_canonical ? projections[i] : std::string(kCanonical[i])) + ".";
      const std::string to =
          "." + (to_canonical ? std::string(kCanonical[i]) : projections[i]) + ".";
      renamed = absl::StrReplaceAll(renamed, {{from, to}});
    }
    return renamed;
  }
};

inline MoeModuleNames MixtralModuleNames() {
  return {.block = "block_sparse_moe", .projections = {"w1", "w3", "w2"}};
}

// How checkpoints and PEFT adapters of an architecture (config.json "architectures", "" for
// the engine's own files) name their MoE modules.
inline MoeModuleNames ModuleNamesOf(absl::string_view architecture) {
  return architecture == "MixtralForCausalLM" ? MixtralModuleNames() : MoeModuleNames{};
}

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MODULE_NAMES_H_
