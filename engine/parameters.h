#ifndef TANDEM_ENGINE_PARAMETERS_H_
#define TANDEM_ENGINE_PARAMETERS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "engine/optimizer.h"

namespace tandem::engine {

// A float32 tensor with an optional gradient of the same shape.
struct Parameter {
  std::vector<int64_t> shape;
  std::vector<float> value;
  std::vector<float> grad;  // Empty until gradients are enabled.
  // Leading dimension is the expert: stored stacked for grouped GEMMs, saved as one tensor
  // per expert under the canonical ".experts.{e}." names.
  bool stacked_experts = false;
  // Stacked tensors: the index of their MoE layer (ModelConfig::MoeLayerIndices), and the global
  // ids of the experts they hold, in their order (every stacked tensor of a layer holds the same);
  // empty: every expert of the model in id order (no shard).
  int moe_layer = -1;
  std::vector<int> experts;

  int64_t size() const { return static_cast<int64_t>(value.size()); }
  float* grad_or_null() { return grad.empty() ? nullptr : grad.data(); }
  // Stacked tensors: the floats of one expert.
  int64_t expert_size() const { return shape[0] == 0 ? 0 : size() / shape[0]; }
  // Where this tensor holds global expert `expert`: its index, or -1 when not held.
  int StackedIndex(int expert) const;
  // The global id of stacked expert `index`.
  int GlobalExpert(int index) const { return experts.empty() ? index : experts[index]; }
  // For `rows` laid out as this tensor (its values, gradients or an optimizer's moments): the
  // rows of `selected` (each held), in that order; and all of them at their experts' global
  // places in a tensor of `num_experts` experts, zeros where an expert is not held.
  std::vector<float> SelectExperts(const std::vector<float>& rows,
                                   const std::vector<int>& selected) const;
  std::vector<float> PlaceExperts(const std::vector<float>& rows, int num_experts) const;
};

// Named parameters in creation order (the order optimizers and checkpoints see).
class ParameterSet {
 public:
  Parameter& Add(const std::string& name, std::vector<int64_t> shape);
  // A tensor of every expert of MoE layer `moe_layer`, stacked (shape[0] is the experts).
  Parameter& AddStackedExperts(const std::string& name, std::vector<int64_t> shape, int moe_layer);
  Parameter* Find(const std::string& name);
  const Parameter* Find(const std::string& name) const;
  const std::vector<std::string>& names() const { return order_; }
  int64_t num_elements() const;

  void EnableGradients();
  void ZeroGradients();

  // Fills with N(0, stddev²) from `rng`.
  static void FillNormal(Parameter& parameter, float stddev, std::mt19937_64& rng);
  static void Fill(Parameter& parameter, float value);

  // The same set holding only `experts` (global ids, each held here), in that order, of every
  // stacked tensor of every layer (gradients too, when enabled): an expert-parallel rank's share.
  // Names stay global: the share's stacked expert i is expert experts[i] of the model, in files
  // too.
  ParameterSet ExpertShard(const std::vector<int>& experts) const;
  // The global ids of the experts MoE layer `moe_layer`'s stacked tensors hold, in their order
  // (Parameter::experts; empty: all, or the layer has no stacked tensor here).
  const std::vector<int>& held_experts(int moe_layer) const;
  // Where MoE layer `moe_layer`'s stacked tensors hold global expert `expert`: its index, or -1
  // when not held.
  int StackedIndex(int moe_layer, int expert) const;

  // To safetensors with canonical names: stacked tensors split per expert, "{e}" inserted
  // after ".experts." (global ids).
  SafetensorsFile ToSafetensors() const;
  // Copies every parameter's values from `file`, which must hold exactly the canonical
  // tensors with matching shapes (INVALID_ARGUMENT naming the first missing, unexpected or
  // misshapen tensor).
  absl::Status LoadFrom(const SafetensorsFile& file);

 private:
  std::map<std::string, Parameter> parameters_;
  std::vector<std::string> order_;
};

// Every parameter of the set for an optimizer, with gradients (enable them first); weight
// decay for matrices only, since norms and biases are scales, not features.
std::vector<Param> OptimizerParams(ParameterSet& parameters);

// "model.layers.3.mlp.experts.{e}.gate_proj.lora_A.weight" -> 3: the layer a name lies in; -1
// for a name outside the layers.
int LayerOfName(absl::string_view name);

// "model.layers.3.mlp.experts.gate_proj.weight", 5 ->
// "model.layers.3.mlp.experts.5.gate_proj.weight"
std::string PerExpertName(const std::string& stacked_name, int expert);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_PARAMETERS_H_
