#ifndef TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_
#define TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_

#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// The smallest valid spec: only the required fields, endpoints on loopback (nothing needs to
// listen there for the spec to be valid). Tests change the field they are about.
inline trainer::v1::JobSpec MinimalValidSpec() {
  trainer::v1::JobSpec spec;
  spec.mutable_task()->set_name("addition");
  spec.set_base_model_path("/models/base.safetensors");
  spec.mutable_lora()->set_rank(4);
  spec.set_algorithm(trainer::v1::ALGORITHM_GRPO);
  spec.mutable_algorithm_config()->set_learning_rate(1e-3);
  spec.set_prompts_per_step(4);
  spec.set_group_size(2);
  spec.set_num_steps(10);
  spec.mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_endpoints()->add_rollout("127.0.0.1:50052");
  spec.mutable_endpoints()->set_weight_store("127.0.0.1:50053");
  spec.mutable_endpoints()->set_router_replay("127.0.0.1:50054");
  return spec;
}

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_
