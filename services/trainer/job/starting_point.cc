#include "services/trainer/job/starting_point.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::trainer {

bool SameLora(const engine::LoraConfig& a, const engine::LoraConfig& b) {
  const std::set<std::string> a_targets(a.targets.begin(), a.targets.end());
  const std::set<std::string> b_targets(b.targets.begin(), b.targets.end());
  return a.rank == b.rank && a.alpha == b.alpha && a.expert_layout == b.expert_layout &&
         a_targets == b_targets;
}

absl::StatusOr<StartingPoint> FindStartingPoint(const trainer::v1::JobSpec& spec,
                                                const CheckpointOwner& owner,
                                                const engine::ModelConfig& model) {
  StartingPoint start{.initialized_from = owner.initialized_from};
  const std::string& output_dir = spec.output_dir();
  auto found = LoadCheckpoint(output_dir, model);
  if (!found.ok()) return found.status();
  const std::string& initial_dir = spec.initial_checkpoint_dir();
  if (found->has_value()) {
    const CheckpointOwner& writer = (*found)->owner;
    // A checkpoint naming no job predates owner records: only a job created before them can
    // find one in its output_dir without starting from it (CreateJob refuses such a directory
    // now), so it is that job's own.
    if (writer.job_id.empty() && initial_dir != output_dir) {
      spdlog::warn("job {}: the checkpoint in {} names no job (an older trainer's); resuming it",
                   owner.job_id, output_dir);
      start.start_step = (*found)->step;
      start.checkpoint = std::move(*found);
      return start;
    }
    if (writer.job_id == owner.job_id) {
      if (writer.spec_fingerprint != owner.spec_fingerprint) {
        return absl::FailedPreconditionError(absl::StrCat(
            "output_dir ", output_dir, " holds this job's checkpoint of step ", (*found)->step,
            " written under another spec (fingerprint ", writer.spec_fingerprint, ", now ",
            owner.spec_fingerprint, "); not resuming it"));
      }
      start.start_step = (*found)->step;
      start.initialized_from = writer.initialized_from;
      start.checkpoint = std::move(*found);
      return start;
    }
    if (initial_dir != output_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("output_dir ", output_dir, " holds the checkpoint of job ", writer.job_id,
                       " (step ", (*found)->step,
                       "), not this job's: a job resumes only its own checkpoint; to start "
                       "from that one, name it in initial_checkpoint_dir"));
    }
  }
  if (initial_dir.empty()) return start;
  if (initial_dir != output_dir) {
    found = LoadCheckpoint(initial_dir, model);
    if (!found.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("initial_checkpoint_dir: ", found.status().message()));
    }
  }
  if (!found->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("initial_checkpoint_dir ", initial_dir, " holds no checkpoint"));
  }
  auto lora_config = weight_store::LoraConfigFromProto(spec.lora());
  if (!lora_config.ok()) return lora_config.status();
  if (!SameLora((*found)->lora.config(), *lora_config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "initial_checkpoint_dir ", initial_dir, " holds an adapter of ",
        (*found)->lora.config().ToJson(), "; the spec's lora is ", lora_config->ToJson()));
  }
  const std::string& source = (*found)->owner.job_id;
  start.initialized_from = source.empty() ? initial_dir : source;
  spdlog::info("job {} starts from the checkpoint in {} (job {}, step {})", owner.job_id,
               initial_dir, start.initialized_from, (*found)->step);
  start.checkpoint = std::move(*found);
  return start;
}

}  // namespace tandem::trainer
