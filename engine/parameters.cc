#include "engine/parameters.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/tensor.h"

namespace tandem::engine {
namespace {

constexpr char kExperts[] = ".experts.";
constexpr size_t kExpertsLength = sizeof(kExperts) - 1;

absl::StatusOr<absl::Span<const float>> FloatsOf(const std::string& name,
                                                 const SafetensorsFile& file,
                                                 const std::vector<int64_t>& shape) {
  auto found = file.tensors.find(name);
  if (found == file.tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
  }
  if (found->second.shape() != shape || found->second.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ",
                                                   found->second.DebugString(), ", expected F32",
                                                   ShapeToString(shape)));
  }
  return found->second.data<float>();
}

Tensor FloatTensor(std::vector<int64_t> shape, const float* values) {
  Tensor tensor = *Tensor::Create(DType::kF32, std::move(shape));
  std::memcpy(tensor.mutable_bytes().data(), values, tensor.byte_size());
  return tensor;
}

}  // namespace

int LayerOfName(absl::string_view name) {
  constexpr absl::string_view kLayers = "model.layers.";
  if (!absl::ConsumePrefix(&name, kLayers)) return -1;
  int layer = -1;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer)) return -1;
  return layer;
}

std::string PerExpertName(const std::string& stacked_name, int expert) {
  const size_t at = stacked_name.find(kExperts);
  return absl::StrCat(stacked_name.substr(0, at + kExpertsLength), expert, ".",
                      stacked_name.substr(at + kExpertsLength));
}

int Parameter::StackedIndex(int expert) const {
  if (experts.empty()) return expert >= 0 && expert < shape[0] ? expert : -1;
  const auto at = std::find(experts.begin(), experts.end(), expert);
  return at == experts.end() ? -1 : static_cast<int>(at - experts.begin());
}

std::vector<float> Parameter::SelectExperts(const std::vector<float>& rows,
                                            const std::vector<int>& selected) const {
  std::vector<float> kept;
  if (rows.empty()) return kept;  // Gradients not enabled.
  const int64_t width = expert_size();
  kept.reserve(selected.size() * width);
  for (int expert : selected) {
    const auto from = rows.begin() + StackedIndex(expert) * width;
    kept.insert(kept.end(), from, from + width);
  }
  return kept;
}

std::vector<float> Parameter::PlaceExperts(const std::vector<float>& rows, int num_experts) const {
  const int64_t width = expert_size();
  std::vector<float> placed(num_experts * width, 0.0f);
  for (int64_t i = 0; i * width < static_cast<int64_t>(rows.size()); ++i) {
    std::copy_n(rows.begin() + i * width, width,
                placed.begin() + GlobalExpert(static_cast<int>(i)) * width);
  }
  return placed;
}

Parameter& ParameterSet::Add(const std::string& name, std::vector<int64_t> shape) {
  const int64_t size = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  Parameter& parameter = parameters_[name];
  parameter.shape = std::move(shape);
  parameter.value.assign(size, 0.0f);
  order_.push_back(name);
  return parameter;
}

Parameter& ParameterSet::AddStackedExperts(const std::string& name, std::vector<int64_t> shape,
                                           int moe_layer) {
  Parameter& parameter = Add(name, std::move(shape));
  parameter.stacked_experts = true;
  parameter.moe_layer = moe_layer;
  return parameter;
}

Parameter* ParameterSet::Find(const std::string& name) {
  auto found = parameters_.find(name);
  return found == parameters_.end() ? nullptr : &found->second;
}

const Parameter* ParameterSet::Find(const std::string& name) const {
  auto found = parameters_.find(name);
  return found == parameters_.end() ? nullptr : &found->second;
}

int64_t ParameterSet::num_elements() const {
  int64_t total = 0;
  for (const auto& [name, parameter] : parameters_) total += parameter.size();
  return total;
}

void ParameterSet::EnableGradients() {
  for (auto& [name, parameter] : parameters_) parameter.grad.assign(parameter.size(), 0.0f);
}

void ParameterSet::ZeroGradients() {
  for (auto& [name, parameter] : parameters_) {
    std::fill(parameter.grad.begin(), parameter.grad.end(), 0.0f);
  }
}

void ParameterSet::FillNormal(Parameter& parameter, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  for (float& value : parameter.value) value = normal(rng);
}

void ParameterSet::Fill(Parameter& parameter, float value) {
  std::fill(parameter.value.begin(), parameter.value.end(), value);
}

ParameterSet ParameterSet::ExpertShard(const std::vector<int>& experts) const {
  ParameterSet shard;
  shard.order_ = order_;
  // Tensor by tensor, slicing while copying: a rank never holds a second whole model.
  for (const auto& [name, parameter] : parameters_) {
    if (!parameter.stacked_experts) {
      shard.parameters_.emplace(name, parameter);
      continue;
    }
    Parameter& part = shard.parameters_[name];
    part.shape = parameter.shape;
    part.shape[0] = static_cast<int64_t>(experts.size());
    part.value = parameter.SelectExperts(parameter.value, experts);
    part.grad = parameter.SelectExperts(parameter.grad, experts);
    part.stacked_experts = true;
    part.moe_layer = parameter.moe_layer;
    part.experts = experts;
  }
  return shard;
}

const std::vector<int>& ParameterSet::held_experts(int moe_layer) const {
  static const std::vector<int>* const kEvery = new std::vector<int>();
  for (const auto& [name, parameter] : parameters_) {
    if (parameter.stacked_experts && parameter.moe_layer == moe_layer) return parameter.experts;
  }
  return *kEvery;
}

int ParameterSet::StackedIndex(int moe_layer, int expert) const {
  const std::vector<int>& held = held_experts(moe_layer);
  if (held.empty()) return expert;  // Every expert, in id order.
  const auto at = std::find(held.begin(), held.end(), expert);
  return at == held.end() ? -1 : static_cast<int>(at - held.begin());
}

SafetensorsFile ParameterSet::ToSafetensors() const {
  SafetensorsFile file;
  for (const std::string& name : order_) {
    const Parameter& parameter = parameters_.at(name);
    if (!parameter.stacked_experts) {
      file.tensors[name] = FloatTensor(parameter.shape, parameter.value.data());
      continue;
    }
    const std::vector<int64_t> expert_shape(parameter.shape.begin() + 1, parameter.shape.end());
    const int64_t expert_size = parameter.size() / parameter.shape[0];
    for (int expert = 0; expert < parameter.shape[0]; ++expert) {
      file.tensors[PerExpertName(name, parameter.GlobalExpert(expert))] =
          FloatTensor(expert_shape, parameter.value.data() + expert * expert_size);
    }
  }
  return file;
}

absl::Status ParameterSet::LoadFrom(const SafetensorsFile& file) {
  std::set<std::string> expected;
  for (const std::string& name : order_) {
    Parameter& parameter = parameters_.at(name);
    if (!parameter.stacked_experts) {
      auto values = FloatsOf(name, file, parameter.shape);
      if (!values.ok()) return values.status();
      std::copy(values->begin(), values->end(), parameter.value.begin());
      expected.insert(name);
      continue;
    }
    const std::vector<int64_t> expert_shape(parameter.shape.begin() + 1, parameter.shape.end());
    const int64_t expert_size = parameter.size() / parameter.shape[0];
    for (int expert = 0; expert < parameter.shape[0]; ++expert) {
      const std::string expert_name = PerExpertName(name, parameter.GlobalExpert(expert));
      auto values = FloatsOf(expert_name, file, expert_shape);
      if (!values.ok()) return values.status();
      std::copy(values->begin(), values->end(), parameter.value.begin() + expert * expert_size);
      expected.insert(expert_name);
    }
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected tensor '", name, "'"));
    }
  }
  return absl::OkStatus();
}

std::vector<Param> OptimizerParams(ParameterSet& parameters) {
  std::vector<Param> params;
  for (const std::string& name : parameters.names()) {
    Parameter& parameter = *parameters.Find(name);
    params.push_back({name, parameter.value.data(), parameter.grad.data(), parameter.size(),
                      parameter.shape.size() >= 2});
  }
  return params;
}

}  // namespace tandem::engine
