#ifndef TANDEM_SERVICES_TRAINER_POLICY_UPDATE_CONFIG_H_
#define TANDEM_SERVICES_TRAINER_POLICY_UPDATE_CONFIG_H_

#include "engine/optimizer.h"
#include "services/trainer/rl/advantages.h"
#include "services/trainer/rl/mismatch_correction.h"
#include "services/trainer/rl/policy_loss.h"

// What a PolicyUpdater does, in its own types. The defaults written here are also a job's: a
// JobSpec leaves a field unset, ResolveJobSpec stores the value from here (job_spec.cc), so the
// two never disagree and no other place keeps a default of its own.
namespace tandem {
class Communicator;
}  // namespace tandem

namespace tandem::engine {
class ExpertParallelExchange;
}  // namespace tandem::engine

namespace tandem::trainer {

class ValueHead;

// Which routes the training forward passes replay.
enum class RouteReplay {
  kOff,  // The trainer routes live.
  kR2,   // Update passes replay the trainer's own old-policy routes.
  kR3,   // Every pass replays the rollout's recorded routes.
};

// A job's value head learns this many times faster than its policy unless its spec says: one
// linear layer must follow the returns' scale within a few steps, far faster than the LoRA moves.
inline constexpr double kCriticLearningRateFactor = 10;

// PPO's critic: with a value head, advantages come from GAE over its values instead of group
// baselines, and a clipped value loss trains it (and, through the trunk, the LoRA).
struct CriticConfig {
  ValueHead* head = nullptr;  // Null: no critic (GRPO).
  // The head's own optimizer (over head->OptimizerParams()) and learning rate; both required
  // with a head.
  engine::AdamW* optimizer = nullptr;
  float learning_rate = 0;
  double gamma = 1.0;
  double lambda = 1.0;
  bool truncated_gae = false;  // Bootstrap truncated samples with their last value (EGAE).
  double loss_coef = 0.1;
  double value_clip = 0.2;  // 0: unclipped.
};

struct PolicyUpdateConfig {
  GroupBaseline baseline = GroupBaseline::kGrpo;
  CriticConfig critic;
  bool whiten_advantages = false;
  PolicyLossConfig loss;
  IsConfig is;
  RouteReplay replay = RouteReplay::kR3;
  int updates_per_step = 1;  // Mini-batches (contiguous whole groups) per call.
  int micro_batch_size = 8;  // Sequences per forward/backward.
  // Of every optimizer update, counted by the optimizer (which a checkpoint restores).
  engine::ScheduleConfig schedule = engine::ScheduleConfig::Constant(1e-4f);
  float max_grad_norm = 1.0f;  // 0: measure only.
  // The rollout's sampling temperature: log-probs are of softmax(logits / temperature), the
  // quantity the rollout reports (1 for greedy).
  float temperature = 1.0f;
  // Data parallelism (not owned; null: this rank holds the whole batch). Each rank updates on
  // its share of the step's samples (DataParallelShare: whole groups, the same share of every
  // mini-batch), in lockstep with the others: token counts, advantage whitening and every
  // statistic are the whole batch's, and gradients are summed over the ranks before clipping,
  // so every rank takes the one-rank step on identical parameters. Host buffers: a Gloo group.
  Communicator* data_parallel = nullptr;
  // Expert parallelism (not owned; a null exchange: none). `exchange` moves the policy's and the
  // reference model's routed rows to the ranks computing their experts; the model and adapter
  // given to PolicyUpdater then hold only this rank's experts (ExpertShard). `group` is the
  // exchange's ranks: they make every forward and backward together, so a rank with fewer
  // micro-batches pads with empty ones. `same_experts` is the ranks holding this rank's experts
  // (null: no other), over which per-expert gradients are summed; `data_parallel` sums the rest,
  // and the clipping norm is over every rank's experts. Not yet with a critic.
  struct ExpertParallelism {
    engine::ExpertParallelExchange* exchange = nullptr;
    Communicator* group = nullptr;
    Communicator* same_experts = nullptr;
  } expert_parallel;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_POLICY_UPDATE_CONFIG_H_
