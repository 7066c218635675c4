#include "services/trainer/update/policy_update.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "engine/cpu_model_ops.h"
#include "engine/expert_parallel_exchange.h"
#include "services/trainer/ranks/rank_agreement.h"
#include "services/trainer/update/batch_advantages.h"
#include "services/trainer/update/expert_parallel_update.h"
#include "services/trainer/update/forward_backward.h"
#include "services/trainer/update/optimizer_step.h"

namespace tandem::trainer {

PolicyUpdater::PolicyUpdater(engine::BaseModel& base, engine::LoraAdapter& lora,
                             engine::AdamW& optimizer, PolicyUpdateConfig config)
    : PolicyUpdater(base, lora, optimizer, config,
                    {.policy = std::make_unique<engine::TransformerTrainingEngine>(
                         base, &lora, std::make_unique<engine::CpuModelOps>(base.config()),
                         config.expert_parallel.exchange),
                     .reference = std::make_unique<engine::TransformerTrainingEngine>(
                         base, nullptr, std::make_unique<engine::CpuModelOps>(base.config()),
                         config.expert_parallel.exchange)}) {}

PolicyUpdater::PolicyUpdater(engine::BaseModel& base, engine::LoraAdapter& lora,
                             engine::AdamW& optimizer, PolicyUpdateConfig config,
                             engine::TrainingEngines engines)
    : base_(base),
      lora_(lora),
      optimizer_(optimizer),
      config_(std::move(config)),
      sync_({.data_parallel = config_.data_parallel,
             .expert_group = expert_parallel() ? config_.expert_parallel.group : nullptr,
             .same_experts = config_.expert_parallel.same_experts},
            [&lora](const engine::Param& param) {
              const engine::Parameter* parameter = lora.parameters().Find(param.name);
              return parameter != nullptr && parameter->stacked_experts;
            }),
      policy_(std::move(engines.policy)),
      reference_(std::move(engines.reference)) {}

absl::StatusOr<std::vector<double>> PolicyUpdater::ResponseLogProbs(
    engine::TrainingEngine& engine, const TrainingBatch& batch, int begin, int end,
    const std::vector<int16_t>* routes) {
  // The policy the rollout sampled from: logits / T.
  const MicroBatch inputs = MicroBatchOf(batch, begin, end, routes);
  absl::StatusOr<std::vector<float>> rows =
      engine.ForwardLogProbs(inputs.sequences, inputs.routes.empty() ? nullptr : &inputs.routes,
                             inputs.targets, config_.temperature);
  if (!rows.ok()) return rows.status();
  return ResponseValues(batch, begin, end, *rows);
}

absl::StatusOr<UpdateStats> PolicyUpdater::Update(const std::vector<TrainingSample>& samples,
                                                  const std::vector<int16_t>& rollout_routes) {
  const engine::ModelConfig& model = base_.config();
  const int route_width = model.num_moe_layers() * model.top_k;
  const bool critic = config_.critic.head != nullptr;
  absl::Status inputs = CheckSamples(samples, rollout_routes, route_width);
  if (inputs.ok()) inputs = CheckExpertParallelism(config_, lora_, critic);
  // Before the first collective, so that one rank's bad input ends the update on every rank
  // at once instead of leaving the others in that collective until its timeout.
  if (config_.data_parallel != nullptr && config_.data_parallel->size() > 1) {
    inputs = AgreeOnFailures(*config_.data_parallel, inputs, "to check its samples");
  }
  if (!inputs.ok()) return inputs;
  TrainingBatch batch = MakeTrainingBatch(samples, rollout_routes, route_width);
  if (!critic) {
    if (absl::Status status =
            AssignGroupAdvantages(batch, config_.baseline, config_.whiten_advantages, sync_);
        !status.ok()) {
      return status;
    }
  } else {
    batch.old_values.assign(batch.mask.size(), 0);
  }

  // The adapter may have changed since the last update (a checkpoint load): the engine
  // computes with what the host holds.
  if (absl::Status status = policy_->AdapterChanged(); !status.ok()) return status;
  UpdateStats stats;
  for (double m : batch.mask) stats.response_tokens += static_cast<int64_t>(m);
  // With one update the update pass runs the old policy itself: its log-probs are logp_old. A
  // critic needs every sample's old value before the first update (advantages are whitened over
  // the batch).
  if (config_.updates_per_step > 1 || critic) {
    if (absl::Status status = OldPolicyPass(batch, stats); !status.ok()) return status;
  }
  if (critic) {
    if (absl::Status status =
            CriticAdvantages(batch, config_.critic, config_.whiten_advantages, sync_, stats);
        !status.ok()) {
      return status;
    }
  }
  const int per_update = batch.rows() / config_.updates_per_step;
  double loss = 0;
  for (int u = 0; u < config_.updates_per_step; ++u) {
    const int end = u + 1 == config_.updates_per_step ? batch.rows() : (u + 1) * per_update;
    auto mini_batch_loss = UpdateMiniBatch(batch, u * per_update, end, stats);
    if (!mini_batch_loss.ok()) return mini_batch_loss.status();
    loss += *mini_batch_loss;
  }
  if (absl::Status status = SumUpdateStats(batch, loss, config_.updates_per_step, sync_, stats);
      !status.ok()) {
    return status;
  }
  return stats;
}

void PolicyUpdater::RecordOldPolicy(TrainingBatch& batch, int begin, int end,
                                    const std::vector<double>& logp, UpdateStats& stats) {
  const size_t first = batch.at(begin, 0), count = logp.size();
  std::copy(logp.begin(), logp.end(), batch.old_logp.begin() + first);
  for (int i = begin; i < end; ++i) batch.have_old[i] = true;
  // The trainer's live routing of the response tokens, before any replay, against the rollout's.
  if (batch.rollout_routes != nullptr) {
    for (int i = begin; i < end; ++i) {
      const int64_t first_response =
          batch.offsets[i] + static_cast<int64_t>(batch.samples[i].prompt.size());
      const int64_t local = first_response - batch.offsets[begin];
      CompareRoutes(policy_->live_routes().data() + local * batch.route_width,
                    batch.rollout_routes->data() + first_response * batch.route_width,
                    static_cast<int64_t>(batch.samples[i].response.size()),
                    base_.config().num_moe_layers(), base_.config().top_k, stats.routing);
    }
  }
  if (config_.replay == RouteReplay::kR2) {
    batch.old_routes.insert(batch.old_routes.end(), policy_->routes().begin(),
                            policy_->routes().end());
  }
  RecordMismatch(batch, begin, end, config_.is, stats);
}

absl::Status PolicyUpdater::OldPolicyPass(TrainingBatch& batch, UpdateStats& stats) {
  const std::vector<int16_t>* routes =
      config_.replay == RouteReplay::kR3 ? batch.rollout_routes : nullptr;
  const int forwards = MicroBatches(batch.rows(), config_.micro_batch_size);
  absl::StatusOr<int> most = sync_.MostInExpertGroup(forwards);
  if (!most.ok()) return most.status();
  for (int begin = 0; begin < batch.rows(); begin += config_.micro_batch_size) {
    const int end = std::min(batch.rows(), begin + config_.micro_batch_size);
    absl::StatusOr<std::vector<double>> logp =
        ResponseLogProbs(*policy_, batch, begin, end, routes);
    if (!logp.ok()) return logp.status();
    RecordOldPolicy(batch, begin, end, *logp, stats);
    if (config_.critic.head == nullptr) continue;
    const float* hidden = policy_->final_hidden().data();
    for (int i = begin; i < end; ++i) {
      for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
        const int64_t row = ResponseRow(batch, begin, i, static_cast<int>(t));
        batch.old_values[batch.at(i, t)] =
            config_.critic.head->Value(hidden + row * base_.config().d_model);
      }
    }
  }
  return PadExpertGroup(*most - forwards, 0);
}

absl::Status PolicyUpdater::PadExpertGroup(int forwards, int updates) {
  // No tokens: the exchange still plans and moves (nothing) with the other ranks.
  const engine::TokenBatch empty;
  const auto forward = [&](engine::TrainingEngine& engine) {
    return engine.ForwardLogProbs(empty, nullptr, {}, config_.temperature).status();
  };
  for (int i = 0; i < forwards + updates; ++i) {
    if (absl::Status status = forward(*policy_); !status.ok()) return status;
    if (i < forwards) continue;
    if (config_.loss.kl_coef > 0) {
      if (absl::Status status = forward(*reference_); !status.ok()) return status;
    }
    if (absl::Status status = policy_->BackwardLogProbs(nullptr, nullptr); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> PolicyUpdater::UpdateMiniBatch(TrainingBatch& batch, int begin, int end,
                                                      UpdateStats& stats) {
  const std::vector<int16_t>* routes = config_.replay == RouteReplay::kR3   ? batch.rollout_routes
                                       : config_.replay == RouteReplay::kR2 ? &batch.old_routes
                                                                            : nullptr;
  // The mini-batch's tokens and sequences over every rank: the loss is the whole mini-batch's.
  double totals[2] = {0, static_cast<double>(end - begin)};
  for (size_t i = batch.at(begin, 0); i < batch.at(end, 0); ++i) totals[0] += batch.mask[i];
  if (absl::Status status = sync_.SumAcrossRanks(totals); !status.ok()) return status;
  const double total_tokens = totals[0];
  const int total_rows = static_cast<int>(totals[1]);
  const int micro_batches = MicroBatches(end - begin, config_.micro_batch_size);
  absl::StatusOr<int> most = sync_.MostInExpertGroup(micro_batches);
  if (!most.ok()) return most.status();
  // A failure while replicas are held leaves this rank holding its own experts again.
  ReplicaHold replicas(replicas_, config_.expert_parallel, base_, lora_, optimizer_);
  absl::Cleanup drop_replicas = [&replicas] { replicas.Drop(); };
  if (absl::Status status = replicas.Hold(); !status.ok()) return status;
  double loss = 0;
  for (int micro = begin; micro < end; micro += config_.micro_batch_size) {
    const int micro_end = std::min(end, micro + config_.micro_batch_size);
    // Without a separate old-policy pass, R2's "old routes" are this forward's live ones.
    const std::vector<int16_t>* replay =
        config_.replay == RouteReplay::kR2 && !batch.have_old[micro] ? nullptr : routes;
    const MicroBatch inputs = MicroBatchOf(batch, micro, micro_end, replay);
    absl::StatusOr<double> micro_loss = ForwardBackward(
        *policy_, inputs.Scored(config_.temperature), [&](const std::vector<float>& rows) {
          return MicroBatchLoss(batch, {micro, micro_end, total_tokens, total_rows}, replay, rows,
                                stats);
        });
    if (!micro_loss.ok()) return micro_loss.status();
    loss += *micro_loss;
  }
  if (absl::Status status = PadExpertGroup(0, *most - micro_batches); !status.ok()) {
    return status;
  }
  if (absl::Status status = replicas.Release(); !status.ok()) return status;
  std::move(drop_replicas).Cancel();
  if (absl::Status status = StepOptimizers(stats); !status.ok()) return status;
  return loss;
}

absl::StatusOr<TokenLoss> PolicyUpdater::MicroBatchLoss(TrainingBatch& batch,
                                                        const MicroBatchTotals& micro,
                                                        const std::vector<int16_t>* replay,
                                                        const std::vector<float>& rows,
                                                        UpdateStats& stats) {
  const std::vector<double> logp = ResponseValues(batch, micro.begin, micro.end, rows);
  if (!batch.have_old[micro.begin]) RecordOldPolicy(batch, micro.begin, micro.end, logp, stats);
  std::vector<double> ref_logp;
  if (config_.loss.kl_coef > 0) {
    absl::StatusOr<std::vector<double>> reference =
        ResponseLogProbs(*reference_, batch, micro.begin, micro.end, replay);
    if (!reference.ok()) return reference.status();
    ref_logp = *std::move(reference);
  }
  const size_t first = batch.at(micro.begin, 0), count = logp.size();
  const auto at = [&](const std::vector<double>& v) {
    return absl::MakeConstSpan(v).subspan(first, count);
  };
  const PolicyLossResult result = ComputePolicyLoss({.logp = logp,
                                                     .old_logp = at(batch.old_logp),
                                                     .advantages = at(batch.advantages),
                                                     .mask = at(batch.is_mask),
                                                     .weights = at(batch.weights),
                                                     .ref_logp = ref_logp,
                                                     .rows = micro.end - micro.begin,
                                                     .cols = batch.cols,
                                                     .total_tokens = micro.total_tokens,
                                                     .total_rows = micro.total_rows},
                                                    config_.loss);
  double tokens = 0;
  for (size_t j = 0; j < count; ++j) tokens += batch.mask[first + j];
  stats.ppo_clip_share += result.clip_share * tokens;
  stats.ref_kl += result.ref_kl * tokens;
  // d loss / d each response token's log-probability, at the row that predicts it.
  TokenLoss loss{.value = result.loss,
                 .dlogp = PositionValues(batch, micro.begin, micro.end, result.dlogp)};
  if (config_.critic.head != nullptr) {
    loss.dhidden.assign(loss.dlogp.size() * base_.config().d_model, 0.0f);
    stats.value_loss +=
        ValueLoss(batch, micro.begin, micro.end, micro.total_tokens, config_.critic,
                  policy_->final_hidden().data(), base_.config().d_model, loss.dhidden);
  }
  return loss;
}

absl::Status PolicyUpdater::StepOptimizers(UpdateStats& stats) {
  if (absl::Status status = sync_.SumGradients(optimizer_.params()); !status.ok()) return status;
  absl::StatusOr<double> norm = sync_.GlobalGradNorm(optimizer_.params());
  if (!norm.ok()) return norm.status();
  absl::StatusOr<OptimizerStep> step =
      ClipAndStep(optimizer_, {config_.schedule, config_.max_grad_norm}, *norm);
  if (!step.ok()) return step.status();
  stats.grad_norm = step->grad_norm;
  stats.learning_rate = step->learning_rate;
  if (step->stepped) {
    if (absl::Status status = policy_->AdapterChanged(); !status.ok()) return status;
  }
  lora_.parameters().ZeroGradients();
  const CriticConfig& critic = config_.critic;
  if (critic.head == nullptr) return absl::OkStatus();
  if (absl::Status status = sync_.SumGradients(critic.optimizer->params()); !status.ok()) {
    return status;
  }
  absl::StatusOr<double> critic_norm = sync_.GlobalGradNorm(critic.optimizer->params());
  if (!critic_norm.ok()) return critic_norm.status();
  const OptimizerSettings critic_settings = {engine::ScheduleConfig::Constant(critic.learning_rate),
                                             config_.max_grad_norm};
  if (absl::Status status = ClipAndStep(*critic.optimizer, critic_settings, *critic_norm).status();
      !status.ok()) {
    return status;
  }
  critic.head->ZeroGradients();
  return absl::OkStatus();
}

}  // namespace tandem::trainer
