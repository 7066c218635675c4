#include "services/trainer/update/policy_update.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/container/fixed_array.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "engine/cpu_model_ops.h"
#include "engine/expert_parallel_exchange.h"
#include "engine/expert_replicas.h"
#include "services/trainer/ranks/rank_agreement.h"
#include "services/trainer/update/optimizer_step.h"

namespace tandem::trainer {
namespace {

// Adds live routes against recorded ones to `stats`, as the engine counts replay disagreement:
// per token x MoE layer, whether the top-k sets differ; recorded rows of -1 (never forwarded)
// are not compared.
void CompareRoutes(const int16_t* live, const int16_t* recorded, int64_t tokens, int layers,
                   int top_k, engine::RoutingStats& stats) {
  for (int64_t t = 0; t < tokens; ++t) {
    bool token_compared = false, token_differs = false;
    for (int l = 0; l < layers; ++l) {
      const int64_t row = (t * layers + l) * top_k;
      if (recorded[row] < 0) continue;
      ++stats.decisions;
      token_compared = true;
      if (!engine::SameExpertSet(live + row, recorded + row, top_k)) {
        ++stats.differing_decisions;
        token_differs = true;
      }
    }
    stats.tokens += token_compared;
    stats.differing_tokens += token_differs;
  }
}

// Over the masked tokens: their count and the sums of the returns, of their squares, of the
// errors (returns - values) and of theirs -- what ExplainedVariance needs, summable over ranks.
std::array<double, 5> ReturnSums(const std::vector<double>& returns,
                                 const std::vector<double>& values,
                                 const std::vector<double>& mask) {
  std::array<double, 5> sums = {0, 0, 0, 0, 0};
  for (size_t j = 0; j < mask.size(); ++j) {
    if (mask[j] == 0) continue;
    const double error = returns[j] - values[j];
    sums[0] += 1;
    sums[1] += returns[j];
    sums[2] += returns[j] * returns[j];
    sums[3] += error;
    sums[4] += error * error;
  }
  return sums;
}

// 1 - Var(returns - values) / Var(returns) from ReturnSums; 0 when the returns are constant.
double ExplainedVariance(const std::array<double, 5>& sums) {
  const auto [n, sum, sum_sq, error_sum, error_sq] = sums;
  if (n == 0) return 0;
  const double variance = sum_sq / n - (sum / n) * (sum / n);
  const double error_variance = error_sq / n - (error_sum / n) * (error_sum / n);
  return variance > 1e-12 ? 1 - error_variance / variance : 0;
}

int MicroBatches(int rows, int micro_batch_size) {
  return (rows + micro_batch_size - 1) / micro_batch_size;
}

// INVALID_ARGUMENT for samples Update cannot train on; `route_width` ids per token when
// `rollout_routes` is not empty.
absl::Status CheckSamples(const std::vector<TrainingSample>& samples,
                          const std::vector<int16_t>& rollout_routes, int route_width) {
  int64_t tokens = 0;
  for (const TrainingSample& sample : samples) {
    if (sample.prompt.empty() || sample.response.empty() ||
        sample.rollout_logprobs.size() != sample.response.size()) {
      return InvalidRequest(
          "BAD_TRAINING_SAMPLE",
          "every sample needs a prompt, a response and one rollout log-prob per response token");
    }
    tokens += static_cast<int64_t>(sample.prompt.size() + sample.response.size());
  }
  if (!rollout_routes.empty() &&
      static_cast<int64_t>(rollout_routes.size()) != tokens * route_width) {
    return InvalidRequest("ROUTE_COUNT_MISMATCH",
                          absl::StrCat("rollout routes hold ", rollout_routes.size(),
                                       " ids; the samples need ", tokens * route_width));
  }
  return absl::OkStatus();
}

}  // namespace

struct PolicyUpdater::Batch {
  const std::vector<TrainingSample>& samples;
  const std::vector<int16_t>* rollout_routes = nullptr;  // Null when none were fetched.
  std::vector<int64_t> offsets;  // Token offset of each sample's sequence; size n + 1.
  int cols = 0;                  // Longest response.
  int route_width = 0;           // MoE layers x top_k.
  std::vector<double> mask, advantages, rollout_logp, old_logp;  // B x cols
  std::vector<double> old_values, returns;                       // B x cols, with a critic
  std::vector<bool> have_old;                                    // Per sample: old_logp filled.
  std::vector<int16_t> old_routes;       // R2: the old-policy pass's live routes.
  std::vector<double> weights, is_mask;  // Mismatch weights and mask after rejection.
  double is_affected = 0;                // Tokens whose weight was clipped, zeroed or rejected.

  int rows() const { return static_cast<int>(samples.size()); }
  size_t at(int sample, int t) const { return static_cast<size_t>(sample) * cols + t; }
};

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
    engine::TrainingEngine& engine, const Batch& batch, int begin, int end,
    const std::vector<int16_t>* routes) {
  engine::TokenBatch tokens;
  for (int i = begin; i < end; ++i) {
    std::vector<int> sequence = batch.samples[i].prompt;
    sequence.insert(sequence.end(), batch.samples[i].response.begin(),
                    batch.samples[i].response.end());
    tokens.Add(sequence);
  }
  // Each response token is scored at the row that predicts it; the others, not at all.
  std::vector<int> targets(tokens.num_tokens(), -1);
  for (int i = begin; i < end; ++i) {
    const std::vector<int>& response = batch.samples[i].response;
    for (size_t t = 0; t < response.size(); ++t) {
      targets[ResponseRow(batch, begin, i, static_cast<int>(t))] = response[t];
    }
  }
  std::vector<int16_t> slice;
  if (routes != nullptr && !routes->empty()) {
    slice.assign(routes->begin() + batch.offsets[begin] * batch.route_width,
                 routes->begin() + batch.offsets[end] * batch.route_width);
  }
  // The policy the rollout sampled from: logits / T.
  absl::StatusOr<std::vector<float>> rows = engine.ForwardLogProbs(
      tokens, slice.empty() ? nullptr : &slice, targets, config_.temperature);
  if (!rows.ok()) return rows.status();
  std::vector<double> logp(static_cast<size_t>(end - begin) * batch.cols, 0);
  for (int i = begin; i < end; ++i) {
    for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
      logp[static_cast<size_t>(i - begin) * batch.cols + t] =
          (*rows)[ResponseRow(batch, begin, i, static_cast<int>(t))];
    }
  }
  return logp;
}

absl::StatusOr<UpdateStats> PolicyUpdater::Update(const std::vector<TrainingSample>& samples,
                                                  const std::vector<int16_t>& rollout_routes) {
  const engine::ModelConfig& model = base_.config();
  Batch batch{.samples = samples};
  batch.route_width = model.num_moe_layers() * model.top_k;
  const bool critic = config_.critic.head != nullptr;
  absl::Status inputs = CheckSamples(samples, rollout_routes, batch.route_width);
  if (inputs.ok()) inputs = CheckExpertParallelism(critic);
  // Before the first collective, so that one rank's bad input ends the update on every rank
  // at once instead of leaving the others in that collective until its timeout.
  if (config_.data_parallel != nullptr && config_.data_parallel->size() > 1) {
    inputs = AgreeOnFailures(*config_.data_parallel, inputs, "to check its samples");
  }
  if (!inputs.ok()) return inputs;
  batch.offsets.push_back(0);
  std::vector<double> scores;
  std::vector<int> groups;
  for (const TrainingSample& sample : samples) {
    batch.offsets.push_back(batch.offsets.back() +
                            static_cast<int64_t>(sample.prompt.size() + sample.response.size()));
    batch.cols = std::max(batch.cols, static_cast<int>(sample.response.size()));
    scores.push_back(sample.reward);
    groups.push_back(sample.group);
  }
  if (!rollout_routes.empty()) batch.rollout_routes = &rollout_routes;
  const size_t size = static_cast<size_t>(batch.rows()) * batch.cols;
  batch.mask.assign(size, 0);
  batch.advantages.assign(size, 0);
  batch.rollout_logp.assign(size, 0);
  batch.old_logp.assign(size, 0);
  batch.weights.assign(size, 1);
  batch.is_mask.assign(size, 0);
  batch.have_old.assign(samples.size(), false);
  for (int i = 0; i < batch.rows(); ++i) {
    for (size_t t = 0; t < samples[i].response.size(); ++t) {
      batch.mask[batch.at(i, t)] = 1;
      batch.rollout_logp[batch.at(i, t)] = samples[i].rollout_logprobs[t];
    }
  }
  if (!critic) {
    const std::vector<double> advantages = GroupAdvantages(scores, groups, config_.baseline);
    for (size_t j = 0; j < size; ++j)
      batch.advantages[j] = batch.mask[j] * advantages[j / batch.cols];
    if (config_.whiten_advantages) {
      auto whitened = WhitenMasked(batch.advantages, batch.mask, [this](absl::Span<double> sums) {
        return sync_.SumAcrossRanks(sums);
      });
      if (!whitened.ok()) return whitened.status();
      batch.advantages = *std::move(whitened);
    }
  } else {
    batch.old_values.assign(size, 0);
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
    if (absl::Status status = CriticAdvantages(batch, stats); !status.ok()) return status;
  }
  const int per_update = batch.rows() / config_.updates_per_step;
  double loss = 0;
  for (int u = 0; u < config_.updates_per_step; ++u) {
    const int end = u + 1 == config_.updates_per_step ? batch.rows() : (u + 1) * per_update;
    auto mini_batch_loss = UpdateMiniBatch(batch, u * per_update, end, stats);
    if (!mini_batch_loss.ok()) return mini_batch_loss.status();
    loss += *mini_batch_loss;
  }
  if (absl::Status status = FinishStats(batch, loss, stats); !status.ok()) return status;
  return stats;
}

absl::Status PolicyUpdater::FinishStats(const Batch& batch, double loss, UpdateStats& stats) const {
  double weights[3] = {0, 0, 0};  // Count, sum and sum of squares of the kept tokens' weights.
  for (size_t j = 0; j < batch.weights.size(); ++j) {
    if (batch.is_mask[j] <= 0) continue;
    weights[0] += 1;
    weights[1] += batch.weights[j];
    weights[2] += batch.weights[j] * batch.weights[j];
  }
  engine::RoutingStats& routing = stats.routing;
  // Each rank's loss terms are already normalized by the batch's tokens: they add up.
  double sums[] = {loss,
                   stats.value_loss,
                   stats.ppo_clip_share,
                   stats.ref_kl,
                   stats.mismatch_kl_k3,
                   stats.large_mismatch_share,
                   batch.is_affected,
                   static_cast<double>(stats.response_tokens),
                   static_cast<double>(routing.decisions),
                   static_cast<double>(routing.differing_decisions),
                   static_cast<double>(routing.tokens),
                   static_cast<double>(routing.differing_tokens),
                   weights[0],
                   weights[1],
                   weights[2]};
  if (absl::Status status = sync_.SumAcrossRanks(sums); !status.ok()) return status;
  const double tokens = std::max(sums[7], 1.0);
  stats.loss = sums[0] / config_.updates_per_step;
  stats.value_loss = sums[1] / config_.updates_per_step;
  stats.ppo_clip_share = sums[2] / tokens;
  stats.ref_kl = sums[3] / tokens;
  stats.mismatch_kl_k3 = sums[4] / tokens;
  stats.large_mismatch_share = sums[5] / tokens;
  stats.is_clipped_share = sums[6] / tokens;
  stats.response_tokens = static_cast<int64_t>(sums[7]);
  routing.decisions = static_cast<int64_t>(sums[8]);
  routing.differing_decisions = static_cast<int64_t>(sums[9]);
  routing.tokens = static_cast<int64_t>(sums[10]);
  routing.differing_tokens = static_cast<int64_t>(sums[11]);
  stats.is_ess = EffectiveSampleSize(sums[12], sums[13], sums[14]);
  return absl::OkStatus();
}

absl::Status PolicyUpdater::CheckExpertParallelism(bool critic) const {
  if (!expert_parallel()) return absl::OkStatus();
  if (critic) {
    return absl::UnimplementedError("a critic with expert parallelism is not supported yet");
  }
  const PolicyUpdateConfig::ExpertParallelism& experts = config_.expert_parallel;
  const int same = experts.same_experts == nullptr ? 1 : experts.same_experts->size();
  if (experts.group == nullptr || config_.data_parallel == nullptr ||
      config_.data_parallel->size() != experts.group->size() * same) {
    return InvalidRequest("BAD_EXPERT_PARALLELISM",
                          "expert parallelism needs its group, and data-parallel ranks = group "
                          "ranks x ranks holding the same experts");
  }
  const std::vector<int> local = experts.exchange->local_experts().experts;
  if (lora_.parameters().held_experts() != local) {
    return InvalidRequest(
        "BAD_EXPERT_PARALLELISM",
        absl::StrCat("the adapter must hold exactly this rank's experts ",
                     absl::StrJoin(local, ","), ", in that order (LoraAdapter::ExpertShard)"));
  }
  return absl::OkStatus();
}

void PolicyUpdater::RecordOldPolicy(Batch& batch, int begin, int end,
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
  std::vector<double> log_ratio(count);
  for (size_t j = 0; j < count; ++j) {
    log_ratio[j] = batch.old_logp[first + j] - batch.rollout_logp[first + j];
    if (batch.mask[first + j] > 0) {
      stats.mismatch_kl_k3 += KlEstimate(-log_ratio[j], KlEstimator::kK3);
      stats.large_mismatch_share += std::abs(log_ratio[j]) > 1 ? 1 : 0;
    }
  }
  const IsWeights weights =
      ComputeIsWeights(log_ratio, absl::MakeConstSpan(batch.mask).subspan(first, count),
                       end - begin, batch.cols, config_.is);
  std::copy(weights.weights.begin(), weights.weights.end(), batch.weights.begin() + first);
  std::copy(weights.mask.begin(), weights.mask.end(), batch.is_mask.begin() + first);
  double tokens = 0;
  for (size_t j = 0; j < count; ++j) tokens += batch.mask[first + j];
  batch.is_affected += weights.clipped_share * tokens;
}

absl::Status PolicyUpdater::OldPolicyPass(Batch& batch, UpdateStats& stats) {
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

int64_t PolicyUpdater::ResponseRow(const Batch& batch, int begin, int i, int t) const {
  return batch.offsets[i] - batch.offsets[begin] +
         static_cast<int64_t>(batch.samples[i].prompt.size()) - 1 + t;
}

absl::Status PolicyUpdater::CriticAdvantages(Batch& batch, UpdateStats& stats) const {
  std::vector<double> rewards(batch.mask.size(), 0);
  absl::FixedArray<bool> truncated(batch.rows(), false);
  for (int i = 0; i < batch.rows(); ++i) {
    const TrainingSample& sample = batch.samples[i];
    rewards[batch.at(i, static_cast<int>(sample.response.size()) - 1)] = sample.reward;
    truncated[i] = config_.critic.truncated_gae && sample.truncated;
  }
  GaeResult gae = ComputeGae(rewards, batch.old_values, batch.mask, batch.rows(), batch.cols,
                             config_.critic.gamma, config_.critic.lambda,
                             absl::MakeConstSpan(truncated.data(), truncated.size()));
  batch.returns = std::move(gae.returns);
  batch.advantages = std::move(gae.advantages);
  if (config_.whiten_advantages) {
    auto whitened = WhitenMasked(batch.advantages, batch.mask, [this](absl::Span<double> sums) {
      return sync_.SumAcrossRanks(sums);
    });
    if (!whitened.ok()) return whitened.status();
    batch.advantages = *std::move(whitened);
  }
  std::array<double, 5> sums = ReturnSums(batch.returns, batch.old_values, batch.mask);
  if (absl::Status status = sync_.SumAcrossRanks(absl::MakeSpan(sums)); !status.ok()) return status;
  stats.explained_variance = ExplainedVariance(sums);
  return absl::OkStatus();
}

double PolicyUpdater::ValueLoss(const Batch& batch, int micro, int micro_end, double total_tokens,
                                std::vector<float>& dhidden) {
  ValueHead& head = *config_.critic.head;
  const int d = base_.config().d_model;
  const float* hidden = policy_->final_hidden().data();
  const double clip = config_.critic.value_clip;
  double loss = 0;
  for (int i = micro; i < micro_end; ++i) {
    for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
      const size_t at = batch.at(i, t);
      const int64_t row = ResponseRow(batch, micro, i, static_cast<int>(t));
      const double value = head.Value(hidden + row * d);
      const double old = batch.old_values[at];
      const double clipped = clip > 0 ? old + std::clamp(value - old, -clip, clip) : value;
      const double error = value - batch.returns[at];
      const double clipped_error = clipped - batch.returns[at];
      // d(0.5 * max(error^2, clipped_error^2)) / dV; the clipped branch is flat outside the clip.
      double dvalue = error;
      if (clipped_error * clipped_error > error * error) {
        loss += 0.5 * clipped_error * clipped_error;
        dvalue = std::abs(value - old) < clip ? clipped_error : 0;
      } else {
        loss += 0.5 * error * error;
      }
      head.Backward(hidden + row * d, config_.critic.loss_coef * dvalue / total_tokens,
                    dhidden.data() + row * d);
    }
  }
  return loss / total_tokens;
}

absl::Status PolicyUpdater::HoldReplicas() {
  if (!replicas_.has_value() || !expert_parallel()) return absl::OkStatus();
  Communicator& group = *config_.expert_parallel.group;
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    if (absl::Status status = engine::HoldReplicas(group, *replicas_, *parameters); !status.ok()) {
      return status;
    }
  }
  return config_.expert_parallel.exchange->SetPlacement(*replicas_);
}

absl::Status PolicyUpdater::ReleaseReplicas() {
  if (!replicas_.has_value() || !expert_parallel()) return absl::OkStatus();
  Communicator& group = *config_.expert_parallel.group;
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    if (absl::Status status = engine::ReleaseReplicas(group, *replicas_, *parameters);
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = config_.expert_parallel.exchange->SetPlacement(replicas_->Owned());
      !status.ok()) {
    return status;
  }
  return optimizer_.Rebind(engine::OptimizerParams(lora_.parameters()));
}

void PolicyUpdater::DropReplicas() {
  if (!replicas_.has_value() || !expert_parallel()) return;
  const int rank = config_.expert_parallel.group->rank();
  for (engine::ParameterSet* parameters : {&base_.parameters(), &lora_.parameters()}) {
    engine::DropReplicas(*replicas_, rank, *parameters);
  }
  absl::Status restored = config_.expert_parallel.exchange->SetPlacement(replicas_->Owned());
  if (restored.ok()) restored = optimizer_.Rebind(engine::OptimizerParams(lora_.parameters()));
  if (!restored.ok()) spdlog::error("dropping the step's replicas: {}", restored.ToString());
}

absl::StatusOr<double> PolicyUpdater::UpdateMiniBatch(Batch& batch, int begin, int end,
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
  absl::Cleanup drop_replicas = [this] { DropReplicas(); };
  if (absl::Status status = HoldReplicas(); !status.ok()) return status;
  double loss = 0;
  for (int micro = begin; micro < end; micro += config_.micro_batch_size) {
    const int micro_end = std::min(end, micro + config_.micro_batch_size);
    // Without a separate old-policy pass, R2's "old routes" are this forward's live ones.
    const std::vector<int16_t>* replay =
        config_.replay == RouteReplay::kR2 && !batch.have_old[micro] ? nullptr : routes;
    absl::StatusOr<std::vector<double>> forwarded =
        ResponseLogProbs(*policy_, batch, micro, micro_end, replay);
    if (!forwarded.ok()) return forwarded.status();
    const std::vector<double>& logp = *forwarded;
    if (!batch.have_old[micro]) RecordOldPolicy(batch, micro, micro_end, logp, stats);
    std::vector<double> ref_logp;
    if (config_.loss.kl_coef > 0) {
      absl::StatusOr<std::vector<double>> reference =
          ResponseLogProbs(*reference_, batch, micro, micro_end, replay);
      if (!reference.ok()) return reference.status();
      ref_logp = *std::move(reference);
    }
    const size_t first = batch.at(micro, 0), count = logp.size();
    const auto rows = [&](const std::vector<double>& v) {
      return absl::MakeConstSpan(v).subspan(first, count);
    };
    const PolicyLossResult result = ComputePolicyLoss({.logp = logp,
                                                       .old_logp = rows(batch.old_logp),
                                                       .advantages = rows(batch.advantages),
                                                       .mask = rows(batch.is_mask),
                                                       .weights = rows(batch.weights),
                                                       .ref_logp = ref_logp,
                                                       .rows = micro_end - micro,
                                                       .cols = batch.cols,
                                                       .total_tokens = total_tokens,
                                                       .total_rows = total_rows},
                                                      config_.loss);
    loss += result.loss;
    double tokens = 0;
    for (size_t j = 0; j < count; ++j) tokens += batch.mask[first + j];
    stats.ppo_clip_share += result.clip_share * tokens;
    stats.ref_kl += result.ref_kl * tokens;
    // d loss / d each response token's log-probability, at the row that predicts it.
    const int64_t positions = batch.offsets[micro_end] - batch.offsets[micro];
    std::vector<float> dlogp(positions, 0.0f);
    for (int i = micro; i < micro_end; ++i) {
      for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
        dlogp[ResponseRow(batch, micro, i, static_cast<int>(t))] =
            static_cast<float>(result.dlogp[static_cast<size_t>(i - micro) * batch.cols + t]);
      }
    }
    std::vector<float> dhidden;
    if (config_.critic.head != nullptr) {
      dhidden.assign(static_cast<size_t>(positions) * base_.config().d_model, 0.0f);
      stats.value_loss += ValueLoss(batch, micro, micro_end, total_tokens, dhidden);
    }
    if (absl::Status status =
            policy_->BackwardLogProbs(dlogp.data(), dhidden.empty() ? nullptr : dhidden.data());
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = PadExpertGroup(0, *most - micro_batches); !status.ok()) {
    return status;
  }
  if (absl::Status status = ReleaseReplicas(); !status.ok()) return status;
  std::move(drop_replicas).Cancel();
  if (absl::Status status = StepOptimizers(stats); !status.ok()) return status;
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
