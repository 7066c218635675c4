#include "services/trainer/job/training_state.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/hf/hf_model.h"
#include "engine/module_names.h"
#include "engine/peft_adapter.h"
#include "services/rollout/client/sampling_rules.h"
#include "services/trainer/job/starting_point.h"
#include "services/trainer/ranks/rank_agreement.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::trainer {
namespace {

bool AllFinite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

absl::StatusOr<JobModel> LoadJobModel(const trainer::v1::JobSpec& spec) {
  auto base = engine::hf::LoadBaseModel(spec.base_model_path());
  if (!base.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("base model: ", base.status().message()));
  }
  if (absl::Status status =
          rollout::ValidateSampling(spec.sampling(), base->config().vocab_size, "spec.sampling");
      !status.ok()) {
    const std::vector<FieldViolation> violations = FieldViolations(status);
    return InvalidField(violations.empty() ? "spec.sampling" : violations[0].field,
                        absl::StrCat("spec.", status.message(), " (the base model's vocabulary)"));
  }
  auto architecture = engine::hf::BaseModelArchitecture(spec.base_model_path());
  if (!architecture.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("base model: ", architecture.status().message()));
  }
  return JobModel{.base = std::make_unique<engine::BaseModel>(*std::move(base)),
                  .architecture = *std::move(architecture)};
}

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Create(const JobPlan& plan,
                                                                     JobModel model,
                                                                     StateOrigin origin) {
  std::unique_ptr<TrainingState> state(new TrainingState(std::move(model)));
  if (absl::Status status = state->StartAdapter(plan, origin); !status.ok()) return status;
  if (absl::Status status = state->CreateOptimizers(plan); !status.ok()) return status;
  if (!origin.checkpoint.has_value()) return state;
  Checkpoint& checkpoint = *origin.checkpoint;
  if (state->value_head_ && (origin.resuming || checkpoint.critic.has_value())) {
    if (absl::Status status = state->RestoreCritic(checkpoint.critic); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = state->optimizer_->ImportState(checkpoint.optimizer); !status.ok()) {
    return status;
  }
  return state;
}

absl::Status TrainingState::StartAdapter(const JobPlan& plan, StateOrigin& origin) {
  if (origin.checkpoint.has_value()) {
    lora_ = std::make_unique<engine::LoraAdapter>(std::move(origin.checkpoint->lora));
    lora_->parameters().EnableGradients();
    return absl::OkStatus();
  }
  auto lora_config = weight_store::LoraConfigFromProto(plan.spec.lora());
  if (!lora_config.ok()) return lora_config.status();
  const std::string& path = plan.spec.initial_adapter_path();
  if (path.empty() || !origin.read_initial_adapter) {
    auto fresh = engine::LoraAdapter::Create(model_config(), *lora_config, plan.spec.seed());
    if (!fresh.ok()) return fresh.status();
    lora_ = std::make_unique<engine::LoraAdapter>(*std::move(fresh));
  } else {
    auto adapter =
        engine::ReadPeftAdapter(path, model_config(), engine::ModuleNamesOf(architecture()));
    if (!adapter.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("initial adapter: ", adapter.status().message()));
    }
    if (!SameLora(adapter->config(), *lora_config)) {
      return absl::FailedPreconditionError(
          absl::StrCat("initial adapter '", path, "' is ", adapter->config().ToJson(),
                       "; the spec's lora is ", lora_config->ToJson()));
    }
    lora_ = std::make_unique<engine::LoraAdapter>(*std::move(adapter));
  }
  lora_->parameters().EnableGradients();
  return absl::OkStatus();
}

absl::Status TrainingState::CreateOptimizers(const JobPlan& plan) {
  auto optimizer = engine::AdamW::Create(plan.adamw, engine::OptimizerParams(lora_->parameters()));
  if (!optimizer.ok()) return optimizer.status();
  optimizer_.emplace(*std::move(optimizer));
  if (!plan.trains_critic) return absl::OkStatus();
  value_head_.emplace(model_config().d_model);
  auto critic_optimizer = engine::AdamW::Create(plan.adamw, value_head_->OptimizerParams());
  if (!critic_optimizer.ok()) return critic_optimizer.status();
  critic_optimizer_.emplace(*std::move(critic_optimizer));
  return absl::OkStatus();
}

absl::Status TrainingState::RestoreCritic(const std::optional<CriticState>& critic) {
  if (!critic.has_value()) {
    return absl::DataLossError("checkpoint of a PPO job holds no value head");
  }
  absl::Status status = value_head_->Restore(critic->head);
  if (status.ok()) status = critic_optimizer_->ImportState(critic->optimizer);
  if (status.ok()) return status;
  return absl::DataLossError(absl::StrCat("checkpoint of a PPO job: ", status.message()));
}

PolicyUpdateConfig TrainingState::UpdateConfig(const JobPlan& plan, Communicator* ranks,
                                               PolicyUpdateConfig::ExpertParallelism experts) {
  PolicyUpdateConfig config = plan.update;
  config.data_parallel = ranks;
  config.expert_parallel = experts;
  if (value_head_) {
    config.critic.head = &*value_head_;
    config.critic.optimizer = &*critic_optimizer_;
  }
  return config;
}

absl::Status TrainingState::Broadcast(Communicator& ranks) {
  std::map<std::string, std::vector<float>> lora;
  for (const std::string& name : lora_->parameters().names()) {
    lora[name] = lora_->parameters().Find(name)->value;
  }
  if (absl::Status status = BroadcastTensors(ranks, lora); !status.ok()) return status;
  // In place: the optimizer and the engines hold the parameters' memory.
  for (const auto& [name, values] : lora) {
    std::vector<float>& held = lora_->parameters().Find(name)->value;
    std::copy(values.begin(), values.end(), held.begin());
  }
  if (absl::Status status = BroadcastOptimizerState(ranks, *optimizer_); !status.ok()) {
    return status;
  }
  if (!value_head_) return absl::OkStatus();
  std::map<std::string, std::vector<float>> head = value_head_->Tensors();
  if (absl::Status status = BroadcastTensors(ranks, head); !status.ok()) return status;
  if (absl::Status status = value_head_->Restore(head); !status.ok()) return status;
  return BroadcastOptimizerState(ranks, *critic_optimizer_);
}

absl::Status TrainingState::KeepExperts(const JobPlan& plan, const std::vector<int>& experts) {
  absl::StatusOr<engine::BaseModel> base = model_.base->ExpertShard(experts);
  if (!base.ok()) return base.status();
  absl::StatusOr<engine::LoraAdapter> lora = lora_->ExpertShard(experts);
  if (!lora.ok()) return lora.status();
  engine::AdamWState state = optimizer_->ExportState();
  const engine::ParameterSet& held = lora_->parameters();
  for (const std::string& name : held.names()) {
    const engine::Parameter& parameter = *held.Find(name);
    if (!parameter.stacked_experts) continue;
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      std::vector<float>& values = state.tensors.at(name + moment);
      values = parameter.SelectExperts(values, experts);
    }
  }
  optimizer_.reset();  // It points into the whole adapter.
  model_.base = std::make_unique<engine::BaseModel>(*std::move(base));
  lora_ = std::make_unique<engine::LoraAdapter>(*std::move(lora));
  lora_->parameters().EnableGradients();
  auto optimizer = engine::AdamW::Create(plan.adamw, engine::OptimizerParams(lora_->parameters()));
  if (!optimizer.ok()) return optimizer.status();
  optimizer_.emplace(*std::move(optimizer));
  return optimizer_->ImportState(state);
}

absl::Status TrainingState::CheckFinite(int64_t step, const UpdateStats& stats) const {
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
    return absl::InternalError(absl::StrCat("step ", step, ": loss ", stats.loss,
                                            ", gradient norm ", stats.grad_norm,
                                            "; not publishing a diverged adapter"));
  }
  for (const std::string& name : lora_->parameters().names()) {
    if (!AllFinite(lora_->parameters().Find(name)->value)) {
      return absl::InternalError(absl::StrCat("step ", step, ": LoRA tensor ", name,
                                              " holds non-finite values after the update"));
    }
  }
  return absl::OkStatus();
}

absl::Status TrainingState::SaveCheckpoint(const std::string& dir, const CheckpointOwner& owner,
                                           int64_t step, int64_t policy_version,
                                           Communicator* experts, bool write) const {
  if (experts == nullptr) {
    std::optional<CriticState> critic;
    if (value_head_) {
      critic = CriticState{value_head_->Tensors(), critic_optimizer_->ExportState()};
    }
    return trainer::SaveCheckpoint(dir, owner, step, policy_version, *lora_,
                                   optimizer_->ExportState(), critic ? &*critic : nullptr);
  }
  absl::StatusOr<engine::LoraAdapter> whole =
      engine::LoraAdapter::Create(model_config(), lora_->config(), 0);
  if (!whole.ok()) return whole.status();
  engine::AdamWState state = optimizer_->ExportState();
  const engine::ParameterSet& held = lora_->parameters();
  for (const std::string& name : held.names()) {
    const engine::Parameter& parameter = *held.Find(name);
    std::vector<float>& joined = whole->parameters().Find(name)->value;
    if (!parameter.stacked_experts) {
      joined = parameter.value;
      continue;
    }
    // Each rank's experts at their place, zeros elsewhere, summed over the group.
    const auto join = [&](std::vector<float>& values) {
      values = parameter.PlaceExperts(values, model_config().num_experts);
      return experts->AllReduceSum(values.data(), static_cast<int64_t>(values.size()));
    };
    joined = parameter.value;
    absl::Status status = join(joined);
    if (status.ok()) status = join(state.tensors.at(name + ".exp_avg"));
    if (status.ok()) status = join(state.tensors.at(name + ".exp_avg_sq"));
    if (!status.ok()) return status;
  }
  if (!write) return absl::OkStatus();
  return trainer::SaveCheckpoint(dir, owner, step, policy_version, *whole, state, nullptr);
}

}  // namespace tandem::trainer
