#ifndef TANDEM_ENGINE_BOUND_WEIGHTS_H_
#define TANDEM_ENGINE_BOUND_WEIGHTS_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model.h"
#include "engine/model_ops.h"
#include "engine/weight.h"

namespace tandem::engine {

// A model's and its adapter's weights bound to one backend (ModelOps::Bind), by name: bound
// before the first pass and again only where a parameter's host storage moved since (an expert
// move, a replica change, gradients enabled), so that no operation translates an address.
class BoundWeights {
 public:
  // `ops`, `model` and `lora` (may be null) must outlive this object.
  BoundWeights(ModelOps& ops, BaseModel& model, LoraAdapter* lora);

  // Binds every parameter not bound yet or whose storage moved; the backend's error otherwise.
  absl::Status Refresh();

  // The bound weight `name` of the model or the adapter (Refresh first); aborts on a name the
  // model's config does not define, a bug in the graph.
  WeightRef Get(const std::string& name) const;
  // The bound adapter of `module` in `layer`, its groups (experts) counted from `first_group`;
  // nullopt without an adapter or when the module is not one of its targets.
  std::optional<LoraProjection> Lora(int layer, absl::string_view module,
                                     int first_group = 0) const;
  // Whether any base-model parameter has gradients enabled (full fine-tuning).
  bool base_trains() const { return base_trains_; }

 private:
  struct Binding {
    const float* values = nullptr;
    const float* gradient = nullptr;
    int64_t size = 0;
    WeightRef weight;
  };
  // Binds what moved in `parameters`; returns whether any of them has gradients enabled.
  absl::StatusOr<bool> RefreshSet(ParameterSet& parameters);

  ModelOps& ops_;
  BaseModel& model_;
  LoraAdapter* const lora_;
  absl::flat_hash_map<std::string, Binding> bindings_;
  bool base_trains_ = false;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BOUND_WEIGHTS_H_
