#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/adamw.h"

namespace tandem::engine {
namespace {

std::string ExpAvgName(const Param& param) { return absl::StrCat(param.name, ".exp_avg"); }
std::string ExpAvgSqName(const Param& param) { return absl::StrCat(param.name, ".exp_avg_sq"); }

// Negated range checks so NaN fails too.
absl::Status CheckBeta(absl::string_view field, float beta) {
  if (!(beta >= 0.0f && beta < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", beta, " is outside [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status CheckParams(const std::vector<Param>& params) {
  std::set<std::string> names;
  for (const Param& param : params) {
    if (param.name.empty()) return absl::InvalidArgumentError("a parameter has an empty name");
    if (!names.insert(param.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param.name, "\" is listed twice"));
    }
    if (param.size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param.name, "\" has negative size ", param.size));
    }
    if (param.size > 0 && (param.value == nullptr || param.grad == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param.name, "\" has a null value or grad pointer"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const std::map<std::string, std::vector<float>>& tensors,
                         const std::string& name, int64_t size) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state lacks tensor \"", name, "\""));
  }
  if (static_cast<int64_t>(it->second.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state tensor \"", name, "\" has ",
                                                   it->second.size(), " elements, expected ",
                                                   size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const AdamWConfig& config) {
  if (absl::Status status = CheckBeta("beta1", config.beta1); !status.ok()) return status;
  if (absl::Status status = CheckBeta("beta2", config.beta2); !status.ok()) return status;
  if (!(config.eps > 0.0f && std::isfinite(config.eps))) {
    return absl::InvalidArgumentError(
        absl::StrCat("eps = ", config.eps, " must be positive and finite"));
  }
  if (!(config.weight_decay >= 0.0f && std::isfinite(config.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay = ", config.weight_decay, " must be non-negative and finite"));
  }
  return absl::OkStatus();
}

AdamW::AdamW(const AdamWConfig& config, std::vector<Param> params)
    : config_(config), params_(std::move(params)) {
  for (const Param& param : params_) {
    exp_avg_.emplace_back(static_cast<size_t>(param.size), 0.0f);
    exp_avg_sq_.emplace_back(static_cast<size_t>(param.size), 0.0f);
  }
}

absl::StatusOr<AdamW> AdamW::Create(const AdamWConfig& config, std::vector<Param> params) {
  if (absl::Status status = Validate(config); !status.ok()) return status;
  if (absl::Status status = CheckParams(params); !status.ok()) return status;
  return AdamW(config, std::move(params));
}

absl::Status AdamW::Step(float lr) {
  if (!(lr >= 0.0f && std::isfinite(lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate = ", lr, " must be non-negative and finite"));
  }
  ++step_;
  const cpu::AdamWStep constants = cpu::AdamWStep::For(
      lr, step_, config_.beta1, config_.beta2, config_.eps, config_.weight_decay);
  for (size_t p = 0; p < params_.size(); ++p) {
    const Param& param = params_[p];
    cpu::AdamWUpdate(param.value, param.grad, exp_avg_[p].data(), exp_avg_sq_[p].data(),
                     param.size, param.decay, constants);
  }
  return absl::OkStatus();
}

absl::Status AdamW::Rebind(std::vector<Param> params) {
  if (absl::Status status = CheckParams(params); !status.ok()) return status;
  const bool same =
      params.size() == params_.size() &&
      std::equal(params.begin(), params.end(), params_.begin(), [](const Param& a, const Param& b) {
        return a.name == b.name && a.size == b.size && a.decay == b.decay;
      });
  if (!same) {
    return absl::InvalidArgumentError("rebinding AdamW to tensors other than its own");
  }
  params_ = std::move(params);
  return absl::OkStatus();
}

AdamWState AdamW::ExportState() const {
  AdamWState state;
  state.step = step_;
  for (size_t p = 0; p < params_.size(); ++p) {
    state.tensors[ExpAvgName(params_[p])] = exp_avg_[p];
    state.tensors[ExpAvgSqName(params_[p])] = exp_avg_sq_[p];
  }
  return state;
}

absl::Status AdamW::CheckState(const AdamWState& state) const {
  if (state.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state step = ", state.step, " is negative"));
  }
  std::set<std::string> expected;
  for (const Param& param : params_) {
    for (const std::string& name : {ExpAvgName(param), ExpAvgSqName(param)}) {
      if (absl::Status status = CheckTensor(state.tensors, name, param.size); !status.ok()) {
        return status;
      }
      expected.insert(name);
    }
  }
  // A tensor this optimizer does not know means a checkpoint of another parameter set, which
  // must not load silently.
  for (const auto& [name, tensor] : state.tensors) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state has unknown tensor \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status AdamW::ImportState(const AdamWState& state) {
  if (absl::Status status = CheckState(state); !status.ok()) return status;
  step_ = state.step;
  for (size_t p = 0; p < params_.size(); ++p) {
    exp_avg_[p] = state.tensors.at(ExpAvgName(params_[p]));
    exp_avg_sq_[p] = state.tensors.at(ExpAvgSqName(params_[p]));
  }
  return absl::OkStatus();
}

double SquaredGradNorm(std::span<const Param> params) {
  double sum_sq = 0.0;
  for (const Param& param : params) {
    for (int64_t i = 0; i < param.size; ++i) {
      sum_sq += static_cast<double>(param.grad[i]) * param.grad[i];
    }
  }
  return sum_sq;
}

float ClipGradNorm(std::span<const Param> params, float max_norm) {
  return ClipGradNormTo(params, max_norm, std::sqrt(SquaredGradNorm(params)));
}

float ClipGradNormTo(std::span<const Param> params, float max_norm, double norm) {
  if (max_norm <= 0.0f || !std::isfinite(norm)) return static_cast<float>(norm);
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1.0) {
    for (const Param& param : params) {
      for (int64_t i = 0; i < param.size; ++i) param.grad[i] *= static_cast<float>(factor);
    }
  }
  return static_cast<float>(norm);
}

absl::Status Validate(const ScheduleConfig& config) {
  if (!(config.peak_lr > 0.0f && std::isfinite(config.peak_lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("peak_lr = ", config.peak_lr, " must be positive and finite"));
  }
  if (!(config.min_lr >= 0.0f && config.min_lr <= config.peak_lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_lr = ", config.min_lr, " is outside [0, peak_lr = ", config.peak_lr, "]"));
  }
  if (config.total_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps = ", config.total_steps, " must be at least 1"));
  }
  if (config.warmup_steps < 0 || config.warmup_steps > config.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps = ", config.warmup_steps,
                     " is outside [0, total_steps = ", config.total_steps, "]"));
  }
  return absl::OkStatus();
}

float LearningRate(const ScheduleConfig& config, int64_t step) {
  step = std::max<int64_t>(step, 0);
  if (step < config.warmup_steps) {
    return static_cast<float>(static_cast<double>(config.peak_lr) * (step + 1) /
                              config.warmup_steps);
  }
  if (config.decay == LrDecay::kConstant) return config.peak_lr;
  if (step >= config.total_steps) return config.min_lr;
  const double progress = static_cast<double>(step - config.warmup_steps) /
                          static_cast<double>(config.total_steps - config.warmup_steps);
  const double remaining = config.decay == LrDecay::kLinear
                               ? 1.0 - progress
                               : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  const double min_lr = config.min_lr;
  return static_cast<float>(min_lr + (config.peak_lr - min_lr) * remaining);
}

}  // namespace tandem::engine
