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

  int64_t size() const { return static_cast<int64_t>(value.size()); }
  float* grad_or_null() { return grad.empty() ? nullptr : grad.data(); }
};

// Named parameters in creation order (the order optimizers and checkpoints see).
class ParameterSet {
 public:
  Parameter& Add(const std::string& name, std::vector<int64_t> shape, bool stacked_experts = false);
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
  // stacked tensor (gradients too, when enabled): an expert-parallel rank's share. Names stay
  // global: the share's stacked expert i is expert experts[i] of the model, in files too.
  ParameterSet ExpertShard(const std::vector<int>& experts) const;
  // The global ids of the experts the stacked tensors hold, in their order; empty: every expert
  // of the model in id order (the set is no shard).
  const std::vector<int>& held_experts() const { return held_experts_; }
  // Where the stacked tensors hold global expert `expert`: its index, or -1 when not held.
  int StackedIndex(int expert) const;
  // For `rows` of a stacked tensor of this set (expert_size floats per held expert): the rows of
  // `experts` (each held), in that order; and all of them at their experts' global places in a
  // tensor of `num_experts` experts, zeros where an expert is not held.
  std::vector<float> SelectExperts(const std::vector<float>& rows, int64_t expert_size,
                                   const std::vector<int>& experts) const;
  std::vector<float> PlaceExperts(const std::vector<float>& rows, int64_t expert_size,
                                  int num_experts) const;
  // The stacked tensors now hold `experts`: for code that moved their rows (MoveExperts) or
  // added and dropped replicas (HoldReplicas, ReleaseReplicas).
  void RelabelExperts(std::vector<int> experts) { held_experts_ = std::move(experts); }

  // To safetensors with canonical names: stacked tensors split per expert, "{e}" inserted
  // after ".experts." (global ids).
  SafetensorsFile ToSafetensors() const;
  // Copies every parameter's values from `file`, which must hold exactly the canonical
  // tensors with matching shapes (INVALID_ARGUMENT naming the first missing, unexpected or
  // misshapen tensor).
  absl::Status LoadFrom(const SafetensorsFile& file);

 private:
  // The global id of stacked expert `index`.
  int GlobalExpert(int index) const { return held_experts_.empty() ? index : held_experts_[index]; }

  std::map<std::string, Parameter> parameters_;
  std::vector<std::string> order_;
  std::vector<int> held_experts_;
};

// Every parameter of the set for an optimizer, with gradients (enable them first); weight
// decay for matrices only, since norms and biases are scales, not features.
std::vector<Param> OptimizerParams(ParameterSet& parameters);

// "model.layers.3.mlp.experts.gate_proj.weight", 5 ->
// "model.layers.3.mlp.experts.5.gate_proj.weight"
std::string PerExpertName(const std::string& stacked_name, int expert);

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_PARAMETERS_H_
