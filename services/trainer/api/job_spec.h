#ifndef TANDEM_SERVICES_TRAINER_JOB_SPEC_H_
#define TANDEM_SERVICES_TRAINER_JOB_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Most data-parallel ranks a job may ask for.
inline constexpr int kMaxDataParallel = 1024;

// Checks a JobSpec against trainer.proto's rules and returns it with every default resolved (what
// Job.spec stores). INVALID_ARGUMENT names the field, e.g. "spec.group_size: GRPO needs >= 2".
// Things only the running job can check (files, services) are left to it.
absl::StatusOr<trainer::v1::JobSpec> ResolveJobSpec(const trainer::v1::JobSpec& spec,
                                                    const std::string& job_id,
                                                    const std::string& default_output_dir);

// 16 hex digits identifying a resolved spec (XXH3-64 of its deterministic serialization, without
// its parallelism). A checkpoint records its job's, so no job resumes a checkpoint written under
// another spec -- but may resume on another number of ranks.
std::string SpecFingerprint(const trainer::v1::JobSpec& spec);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_SPEC_H_
