#ifndef TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_
#define TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_

#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// The smallest valid spec: only the required fields. Tests change the field they are about.
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
  return spec;
}

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SPEC_TESTING_H_
