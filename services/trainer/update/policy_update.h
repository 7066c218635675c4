#ifndef TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_
#define TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "engine/expert_placement.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/training_engine.h"
#include "engine/transformer.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/rl/policy_loss.h"
#include "services/trainer/rl/value_head.h"
#include "services/trainer/update/gradient_sync.h"
#include "services/trainer/update/policy_update_config.h"

namespace tandem::trainer {

// One scored rollout sample the policy learns from.
struct TrainingSample {
  std::vector<int> prompt;
  std::vector<int> response;            // Generated tokens.
  std::vector<float> rollout_logprobs;  // Per response token, from the rollout.
  int group = 0;                        // The prompt it answers.
  double reward = 0;
  bool truncated = false;  // Stopped at max_new_tokens: PPO's truncated GAE bootstraps it.
};

struct UpdateStats {
  double loss = 0;           // Mean over mini-batches.
  double grad_norm = 0;      // Of the last mini-batch, before clipping.
  double learning_rate = 0;  // Of the last update.
  double ppo_clip_share = 0;
  double ref_kl = 0;
  double is_ess = 1;
  double is_clipped_share = 0;
  double mismatch_kl_k3 = 0;  // Mean over response tokens of k3(rollout || trainer old policy).
  // Share of response tokens with |logp_old - logp_rollout| > 1.
  double large_mismatch_share = 0;
  // With a critic: the value loss (mean over mini-batches, before loss_coef), and the share of
  // the returns' variance the old values explain, 1 - Var(R - V_old) / Var(R) over tokens.
  double value_loss = 0;
  double explained_variance = 0;
  // The trainer's live routing of the response tokens against the rollout's routes in the
  // old-policy pass; zeros when no rollout routes were given.
  engine::RoutingStats routing;
  int64_t response_tokens = 0;
};

// GRPO-style policy updates of a LoRA adapter on scored samples: advantages, the old policy's
// log-probs (and routes), mismatch weights, then for each mini-batch forward with replay,
// the clipped policy loss, backward through the engine, gradient clipping and AdamW.
class PolicyUpdater {
 public:
  // The models and the optimizer are not owned and must outlive the updater; `optimizer` holds
  // `lora`'s parameters, whose gradients must be enabled. `engines` (owned) compute the policy and
  // the reference model (see engine::MakeTrainingEngines); the first constructor runs both on the
  // CPU.
  PolicyUpdater(engine::BaseModel& base, engine::LoraAdapter& lora, engine::AdamW& optimizer,
                PolicyUpdateConfig config);
  PolicyUpdater(engine::BaseModel& base, engine::LoraAdapter& lora, engine::AdamW& optimizer,
                PolicyUpdateConfig config, engine::TrainingEngines engines);

  // `rollout_routes`: [sum over samples of (prompt + response) tokens, MoE layers, top_k] in
  // sample order (the layout FetchReplayRoutes fills), or empty when none were fetched (R3 then
  // routes live). INVALID_ARGUMENT for inconsistent samples; with data-parallel ranks every rank
  // checks its own before the first collective, and the others then fail with ABORTED naming
  // the rank whose samples were bad.
  absl::StatusOr<UpdateStats> Update(const std::vector<TrainingSample>& samples,
                                     const std::vector<int16_t>& rollout_routes);

  // Expert parallelism: replicas of hot experts for the training passes of the Updates from now
  // on (`placement`: the exchange's owners plus replicas; nullopt: none). Each mini-batch takes
  // them from their owners before its passes and adds their gradients to the owners' after, so
  // results do not change (up to summation order); a separate old-policy pass and the optimizer
  // see only the owners.
  void UseReplicas(std::optional<engine::ExpertPlacement> placement) {
    replicas_ = std::move(placement);
  }

 private:
  struct Batch;

  absl::Status OldPolicyPass(Batch& batch, UpdateStats& stats);
  // PPO: token rewards (the score at each sample's last token), GAE over the old values,
  // returns, whitening and explained variance.
  absl::Status CriticAdvantages(Batch& batch, UpdateStats& stats) const;
  // Empty forward and backward passes, so this rank makes as many as the busiest rank of its
  // expert-parallel group: `forwards` old-policy forwards or `updates` update micro-batches.
  absl::Status PadExpertGroup(int forwards, int updates);
  bool expert_parallel() const { return config_.expert_parallel.exchange != nullptr; }
  // INVALID_ARGUMENT for an expert-parallel config that would train wrong (groups that do not
  // multiply to the data-parallel ranks, an adapter that is not this rank's shard); UNIMPLEMENTED
  // with a critic.
  absl::Status CheckExpertParallelism(bool critic) const;
  // The step's statistics over every rank's share, normalized by the batch's tokens.
  absl::Status FinishStats(const Batch& batch, double loss, UpdateStats& stats) const;
  // Adds the value loss of samples [micro, micro_end) (this forward's hidden states) to
  // `dhidden` and the value head's gradients; returns its token-mean share over `total_tokens`.
  double ValueLoss(const Batch& batch, int micro, int micro_end, double total_tokens,
                   std::vector<float>& dhidden);
  // Row of the hidden state (and logits) that predicts response token t of sample i, counted
  // from sample `begin`'s first token.
  int64_t ResponseRow(const Batch& batch, int begin, int i, int t) const;
  // B x cols log-probs of the response tokens of samples [begin, end) under logits / T, by a
  // forward of `engine` (with `routes`, when given, replayed), which keeps its activations for
  // BackwardLogProbs.
  absl::StatusOr<std::vector<double>> ResponseLogProbs(engine::TrainingEngine& engine,
                                                       const Batch& batch, int begin, int end,
                                                       const std::vector<int16_t>* routes);
  // Takes `logp` (the policy before this call's updates, just forwarded) as logp_old of samples
  // [begin, end) with its routing statistics, R2 routes and mismatch weights.
  void RecordOldPolicy(Batch& batch, int begin, int end, const std::vector<double>& logp,
                       UpdateStats& stats);
  absl::StatusOr<double> UpdateMiniBatch(Batch& batch, int begin, int end, UpdateStats& stats);
  // After a mini-batch's passes: its gradients summed over the ranks that share them, clipped,
  // and the policy's (and the critic's) optimizer stepped.
  absl::Status StepOptimizers(UpdateStats& stats);
  // Around a mini-batch's passes with replicas_ (nothing without): the model and the adapter
  // take the replicas and the exchange computes with them, then the replicas' gradients go to
  // their owners, the owners' placement returns and the optimizer follows the adapter's memory.
  // DropReplicas does the last two on this rank alone after a failure in between.
  absl::Status HoldReplicas();
  absl::Status ReleaseReplicas();
  void DropReplicas();

  engine::BaseModel& base_;
  engine::LoraAdapter& lora_;
  engine::AdamW& optimizer_;
  const PolicyUpdateConfig config_;
  const GradientSync sync_;
  std::unique_ptr<engine::TrainingEngine> policy_;
  std::unique_ptr<engine::TrainingEngine> reference_;  // The base model alone, for the KL penalty.
  std::optional<engine::ExpertPlacement> replicas_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_
