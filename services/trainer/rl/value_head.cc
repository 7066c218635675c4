#include "services/trainer/rl/value_head.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {
namespace {

constexpr char kWeight[] = "value_head.weight";
constexpr char kBias[] = "value_head.bias";

}  // namespace

ValueHead::ValueHead(int d_model)
    : weight_(d_model, 0.0f), weight_grad_(d_model, 0.0f), bias_(1, 0.0f), bias_grad_(1, 0.0f) {}

double ValueHead::Value(const float* hidden) const {
  double value = bias_[0];
  for (size_t i = 0; i < weight_.size(); ++i) value += double{weight_[i]} * hidden[i];
  return value;
}

void ValueHead::Backward(const float* hidden, double dvalue, float* dhidden) {
  for (size_t i = 0; i < weight_.size(); ++i) {
    weight_grad_[i] += static_cast<float>(dvalue * hidden[i]);
    dhidden[i] += static_cast<float>(dvalue * weight_[i]);
  }
  bias_grad_[0] += static_cast<float>(dvalue);
}

void ValueHead::ZeroGradients() {
  std::fill(weight_grad_.begin(), weight_grad_.end(), 0.0f);
  bias_grad_[0] = 0.0f;
}

std::vector<engine::Param> ValueHead::OptimizerParams() {
  return {
      {.name = kWeight,
       .value = weight_.data(),
       .grad = weight_grad_.data(),
       .size = static_cast<int64_t>(weight_.size())},
      {.name = kBias, .value = bias_.data(), .grad = bias_grad_.data(), .size = 1, .decay = false}};
}

std::map<std::string, std::vector<float>> ValueHead::Tensors() const {
  return {{kWeight, weight_}, {kBias, bias_}};
}

absl::Status ValueHead::Restore(const std::map<std::string, std::vector<float>>& tensors) {
  const auto weight = tensors.find(kWeight);
  const auto bias = tensors.find(kBias);
  if (tensors.size() != 2 || weight == tensors.end() || bias == tensors.end() ||
      weight->second.size() != weight_.size() || bias->second.size() != 1) {
    return InvalidRequest("VALUE_HEAD_MISMATCH",
                          absl::StrCat("a value head needs exactly ", kWeight, " [", weight_.size(),
                                       "] and ", kBias, " [1]"));
  }
  // Copied in place: the optimizer holds pointers to this memory.
  std::copy(weight->second.begin(), weight->second.end(), weight_.begin());
  bias_[0] = bias->second[0];
  return absl::OkStatus();
}

}  // namespace tandem::trainer
