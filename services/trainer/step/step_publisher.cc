#include "services/trainer/step/step_publisher.h"

#include "absl/strings/str_cat.h"
#include "services/trainer/ranks/rank_agreement.h"
#include "services/trainer/step/sharded_publish.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::trainer {

absl::Status StepPublisher::RideOutOutage(const std::function<absl::Status(int attempt)>& call) {
  return trainer::RideOutOutage("weight-store", config_.outage, cancelled_, clock_, call);
}

absl::StatusOr<int64_t> StepPublisher::NewestVersion() {
  int64_t newest = 0;
  absl::Status status = RideOutOutage([&](int) {
    absl::StatusOr<weightstore::v1::Manifest> manifest =
        weight_store::GetManifest(store_, config_.adapter_name, 0, config_.rpc_timeout);
    if (absl::IsNotFound(manifest.status())) return absl::OkStatus();  // No version yet.
    if (manifest.ok()) newest = manifest->version();
    return manifest.status();
  });
  if (!status.ok()) return status;
  return newest;
}

absl::StatusOr<weight_store::AdapterVersion> StepPublisher::Build(
    const engine::LoraAdapter& lora, const engine::ModelConfig& model, int64_t version,
    Communicator* ranks, const placement::LayerPlacements* placements) {
  if (placements == nullptr) {
    return weight_store::BuildAdapterVersion(lora, model, config_.adapter_name, version,
                                             type::v1::DTYPE_F32, config_.ranks);
  }
  auto published = weight_store::BuildExpertParallelVersion(
      lora, model, config_.adapter_name, version, *placements, ranks->size() / placements->ranks(),
      ranks->rank());
  if (!published.ok()) return published.status();
  // Each rank knows its own shard's checksum: rank 0's manifest needs every one.
  absl::StatusOr<std::vector<uint64_t>> checksums =
      GatherDigests(*ranks, published->manifest.shards(ranks->rank()).xxh3_64());
  if (!checksums.ok()) return checksums.status();
  for (int rank = 0; rank < ranks->size(); ++rank) {
    published->manifest.mutable_shards(rank)->set_xxh3_64((*checksums)[rank]);
  }
  return published;
}

absl::Status StepPublisher::Publish(const engine::LoraAdapter& lora,
                                    const engine::ModelConfig& model, int64_t version, int64_t step,
                                    Communicator* ranks,
                                    const placement::LayerPlacements* placements) {
  auto published = Build(lora, model, version, ranks, placements);
  if (!published.ok()) return published.status();
  auto& labels = *published->manifest.mutable_labels();
  labels["job_id"] = config_.job_id;
  labels["step"] = absl::StrCat(step);
  if (!config_.architecture.empty())
    labels[weight_store::kArchitectureLabel] = config_.architecture;
  if (ranks != nullptr) {
    return PublishTogether(
        *ranks, store_, *published, {.ucx = config_.ucx, .peers = &peers_},
        [this](const std::function<absl::Status()>& call) {
          return RideOutOutage([&](int) { return call(); });
        },
        config_.phase_timeout);
  }
  return RideOutOutage([&](int attempt) {
    const absl::Status status =
        weight_store::PublishAdapter(store_, published->manifest, published->shard_views(),
                                     {.ucx = config_.ucx, .peers = &peers_})
            .status();
    // A retry after an outage finds the version committed when the first try's commit landed
    // just before the store went away: this trainer is its only producer, so it is ours.
    return attempt > 0 && absl::IsAlreadyExists(status) ? absl::OkStatus() : status;
  });
}

absl::Status StepPublisher::AwaitServed(int64_t version) {
  return rollout::AwaitVersionServed(replicas_, config_.adapter_name, version, config_.swap,
                                     clock_);
}

}  // namespace tandem::trainer
