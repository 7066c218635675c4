#ifndef TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_
#define TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/communicator.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/training_engine.h"
#include "engine/transformer.h"
#include "placement/expert_placement.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/rl/policy_loss.h"
#include "services/trainer/rl/value_head.h"
#include "services/trainer/update/forward_backward.h"
#include "services/trainer/update/gradient_sync.h"
#include "services/trainer/update/policy_update_config.h"
#include "services/trainer/update/training_batch.h"
#include "services/trainer/update/update_statistics.h"

namespace tandem::trainer {

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
  // on (`placements`: the exchange's owners plus each MoE layer's replicas; nullopt: none). Each
  // mini-batch takes them from their owners before its passes and adds their gradients to the
  // owners' after, so results do not change (up to summation order); a separate old-policy pass and
  // the optimizer see only the owners.
  void UseReplicas(std::optional<placement::LayerPlacements> placements) {
    replicas_ = std::move(placements);
  }

  // What an Update does with each routed row's expert (an expert exchange counts every pass as
  // rows computed): `all` its passes -- its mini-batch's forward and backward, a reference
  // forward with a KL penalty, and a separate old-policy forward with more than one update or a
  // critic; `with_replicas` those made while replicas are held (all but the old-policy forward);
  // `replica_holds` how often replicas are taken and given back (once per mini-batch).
  struct ExpertPasses {
    int all = 0;
    int with_replicas = 0;
    int replica_holds = 0;
  };
  ExpertPasses ExpertPassesPerStep() const {
    const bool old_policy_pass = config_.updates_per_step > 1 || config_.critic.head != nullptr;
    const int per_mini_batch = 2 + (config_.loss.kl_coef > 0 ? 1 : 0);
    return {.all = per_mini_batch + (old_policy_pass ? 1 : 0),
            .with_replicas = per_mini_batch,
            .replica_holds = config_.updates_per_step};
  }

 private:
  absl::Status OldPolicyPass(TrainingBatch& batch, UpdateStats& stats);
  // Empty forward and backward passes, so this rank makes as many as the busiest rank of its
  // expert-parallel group: `forwards` old-policy forwards or `updates` update micro-batches.
  absl::Status PadExpertGroup(int forwards, int updates);
  bool expert_parallel() const { return config_.expert_parallel.exchange != nullptr; }
  // B x cols log-probs of the response tokens of samples [begin, end) under logits / T, by a
  // forward of `engine` (with `routes`, when given, replayed), which keeps its activations for
  // BackwardLogProbs.
  absl::StatusOr<std::vector<double>> ResponseLogProbs(engine::TrainingEngine& engine,
                                                       const TrainingBatch& batch, int begin,
                                                       int end, const std::vector<int16_t>* routes);
  // Takes `logp` (the policy before this call's updates, just forwarded) as logp_old of samples
  // [begin, end) with its routing statistics, R2 routes and mismatch weights.
  void RecordOldPolicy(TrainingBatch& batch, int begin, int end, const std::vector<double>& logp,
                       UpdateStats& stats);
  absl::StatusOr<double> UpdateMiniBatch(TrainingBatch& batch, int begin, int end,
                                         UpdateStats& stats);
  // Samples [begin, end) of a mini-batch whose tokens and sequences over every rank are
  // total_tokens and total_rows.
  struct MicroBatchTotals {
    int begin = 0;
    int end = 0;
    double total_tokens = 0;
    int total_rows = 0;
  };
  // The objective on one micro-batch's log-probs `rows` (a ForwardBackward's loss): the old
  // policy recorded if it was not, the reference model's log-probs with a KL penalty, the policy
  // loss (and the critic's), their gradients per position.
  absl::StatusOr<TokenLoss> MicroBatchLoss(TrainingBatch& batch, const MicroBatchTotals& micro,
                                           const std::vector<int16_t>* replay,
                                           const std::vector<float>& rows, UpdateStats& stats);
  // After a mini-batch's passes: its gradients summed over the ranks that share them, clipped,
  // and the policy's (and the critic's) optimizer stepped.
  absl::Status StepOptimizers(UpdateStats& stats);

  engine::BaseModel& base_;
  engine::LoraAdapter& lora_;
  engine::AdamW& optimizer_;
  const PolicyUpdateConfig config_;
  const GradientSync sync_;
  std::unique_ptr<engine::TrainingEngine> policy_;
  std::unique_ptr<engine::TrainingEngine> reference_;  // The base model alone, for the KL penalty.
  std::optional<placement::LayerPlacements> replicas_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_POLICY_UPDATE_H_
