#include "engine/bound_weights.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::engine {

BoundWeights::BoundWeights(ModelOps& ops, BaseModel& model, LoraAdapter* lora)
    : ops_(ops), model_(model), lora_(lora) {}

absl::Status BoundWeights::Refresh() {
  absl::StatusOr<bool> base_trains = RefreshSet(model_.parameters());
  if (!base_trains.ok()) return base_trains.status();
  base_trains_ = *base_trains;
  return lora_ == nullptr ? absl::OkStatus() : RefreshSet(lora_->parameters()).status();
}

absl::StatusOr<bool> BoundWeights::RefreshSet(ParameterSet& parameters) {
  bool trains = false;
  for (const std::string& name : parameters.names()) {
    Parameter& parameter = *parameters.Find(name);
    trains = trains || parameter.grad_or_null() != nullptr;
    Binding& binding = bindings_[name];
    if (binding.values == parameter.value.data() && binding.gradient == parameter.grad_or_null() &&
        binding.size == parameter.size()) {
      continue;
    }
    absl::StatusOr<WeightRef> bound = ops_.Bind(HostWeight::Of(parameter));
    if (!bound.ok()) {
      bindings_.erase(name);
      return Annotate(bound.status(), absl::StrCat("binding ", name, ": "));
    }
    binding = Binding{parameter.value.data(), parameter.grad_or_null(), parameter.size(), *bound};
  }
  return trains;
}

WeightRef BoundWeights::Get(const std::string& name) const {
  const auto bound = bindings_.find(name);
  if (bound == bindings_.end()) std::abort();
  return bound->second.weight;
}

std::optional<LoraProjection> BoundWeights::Lora(int layer, absl::string_view module,
                                                 int first_group) const {
  if (lora_ == nullptr) return std::nullopt;
  const std::optional<LoraProjectionLayout> layout = lora_->ProjectionLayout(layer, module);
  if (!layout.has_value()) return std::nullopt;
  const LoraProjection projection{.a = Get(layout->a),
                                  .b = Get(layout->b),
                                  .a_group_stride = layout->a_group_stride,
                                  .b_group_stride = layout->b_group_stride,
                                  .rank = layout->rank,
                                  .scale = layout->scale};
  return projection.FromGroup(first_group);
}

}  // namespace tandem::engine
