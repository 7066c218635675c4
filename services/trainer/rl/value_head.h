#ifndef TANDEM_SERVICES_TRAINER_VALUE_HEAD_H_
#define TANDEM_SERVICES_TRAINER_VALUE_HEAD_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/optimizer.h"

namespace tandem::trainer {

// PPO's critic, sharing the policy's trunk: V(s) = w · h + b on the final normalized hidden state
// h (Transformer::final_hidden) at the position that predicts the next token. It starts at zero
// (V = 0 until it learns, and no gradient into the trunk before w moves); an optimizer of its own
// trains w and b, and the value loss also reaches the LoRA through Transformer::Backward's
// dhidden. Only the trainer holds it: published adapters stay plain LoRA.
class ValueHead {
 public:
  explicit ValueHead(int d_model);

  double Value(const float* hidden) const;
  // For one hidden row with d(loss)/dV = dvalue: accumulates the gradients of w and b and adds
  // d(loss)/dh to `dhidden` (one row).
  void Backward(const float* hidden, double dvalue, float* dhidden);
  void ZeroGradients();

  // "value_head.weight" (decayed) and "value_head.bias" (not), for the optimizer; the pointers
  // stay valid as long as this object.
  std::vector<engine::Param> OptimizerParams();

  // The same two tensors by name, for a checkpoint, and back. INVALID_ARGUMENT, changing
  // nothing, unless `tensors` holds exactly both with this head's sizes.
  std::map<std::string, std::vector<float>> Tensors() const;
  absl::Status Restore(const std::map<std::string, std::vector<float>>& tensors);

 private:
  std::vector<float> weight_, weight_grad_;
  std::vector<float> bias_, bias_grad_;  // One element each.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_VALUE_HEAD_H_
