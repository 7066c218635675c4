#ifndef TANDEM_SERVICES_TRAINER_JOB_PLAN_H_
#define TANDEM_SERVICES_TRAINER_JOB_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/optimizer.h"
#include "services/trainer/update/policy_update_config.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// What a job runs, decided once when its spec is resolved: the resolved spec (what Job.spec
// stores and the API reports, every default in it) and the typed configuration the trainer's
// stages take. Nothing downstream reads a proto enum or decides a default again.
struct JobPlan {
  trainer::v1::JobSpec spec;
  // critic.head, critic.optimizer and data_parallel are the run's objects: it points them.
  PolicyUpdateConfig update;
  engine::AdamWConfig adamw;   // The LoRA's optimizer, and the value head's.
  bool trains_critic = false;  // PPO: the run owns a value head.
  int data_parallel = 1;       // Copies of the experts (spec.parallelism).
  int expert_parallel = 1;     // Ranks sharing one copy of the experts.
  int ranks() const { return data_parallel * expert_parallel; }  // Trainer ranks.
  bool balance_experts = false;  // Re-place experts before each step by its routed load.
  // ASYNC: how many steps generation runs ahead of training (max_staleness); 0 in SYNC.
  int64_t lookahead = 0;

  // Whether the run saves a checkpoint after `step`: every checkpoint_every steps, and the last.
  bool CheckpointsAfter(int64_t step) const;
};

// ResolveJobSpec(spec, job_id, default_output_dir), then the typed plan of the resolved spec.
// A spec that was resolved before (a stored job's) plans to the same plan again.
absl::StatusOr<JobPlan> PlanJob(const trainer::v1::JobSpec& spec, const std::string& job_id,
                                const std::string& default_output_dir);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_PLAN_H_
