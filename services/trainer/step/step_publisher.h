#ifndef TANDEM_SERVICES_TRAINER_STEP_PUBLISHER_H_
#define TANDEM_SERVICES_TRAINER_STEP_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/communicator.h"
#include "engine/model.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/rollout/client/version_swap.h"
#include "services/trainer/job/store_outage.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"
#include "transfer/ucx_peer_cache.h"
#include "transfer/ucx_transport.h"

namespace tandem::trainer {

struct StepPublisherConfig {
  std::string job_id;
  std::string adapter_name;
  // The base model's architecture (config.json's), labelling every version; "" for none.
  std::string architecture;
  int ranks = 1;  // The job's trainer ranks: each publishes one shard of every version.
  transfer::UcxWorker* ucx = nullptr;  // Puts by UCX when set.
  absl::Duration rpc_timeout = absl::Minutes(5);
  // How long ranks wait for rank 0's begin and commit of a sharded version.
  absl::Duration phase_timeout = absl::Minutes(15);
  OutagePolicy outage;  // Every weight-store call rides out an outage within it.
  rollout::VersionSwapOptions swap;
};

// How a run's adapter reaches the rollout replicas: published to weight-store as a version
// (alone, or sharded together with the job's other ranks) labelled with the job and step, then
// awaited until every replica serves it, as their WatchAdapterStatus streams tell.
class StepPublisher {
 public:
  // `store`, the replicas' stubs, `cancelled` and `clock` must outlive the publisher.
  StepPublisher(StepPublisherConfig config, const weight_store::WeightStoreStubs& store,
                std::vector<rollout::ReplicaStub> replicas, const std::atomic<bool>& cancelled,
                Clock& clock)
      : config_(std::move(config)),
        store_(store),
        replicas_(std::move(replicas)),
        cancelled_(cancelled),
        clock_(clock) {}

  // The adapter's newest committed version; 0 when it has none.
  absl::StatusOr<int64_t> NewestVersion();
  // Publishes `lora` as `version` after `step`: from this rank alone when `ranks` is null, else
  // collectively with every rank of the job (PublishTogether). With expert parallelism
  // (`placements`: the experts over each expert-parallel group of `ranks`), each rank holds only
  // its experts and publishes a share of them (weight_store::BuildExpertParallelVersion).
  absl::Status Publish(const engine::LoraAdapter& lora, const engine::ModelConfig& model,
                       int64_t version, int64_t step, Communicator* ranks,
                       const placement::LayerPlacements* placements = nullptr);
  // Returns once every replica serves `version` (AwaitVersionServed).
  absl::Status AwaitServed(int64_t version);

 private:
  absl::Status RideOutOutage(const std::function<absl::Status(int attempt)>& call);
  // The version's manifest and this rank's shard (collective with expert parallelism: the
  // shards' checksums are gathered).
  absl::StatusOr<weight_store::AdapterVersion> Build(const engine::LoraAdapter& lora,
                                                     const engine::ModelConfig& model,
                                                     int64_t version, Communicator* ranks,
                                                     const placement::LayerPlacements* placements);

  const StepPublisherConfig config_;
  const weight_store::WeightStoreStubs& store_;
  const std::vector<rollout::ReplicaStub> replicas_;
  const std::atomic<bool>& cancelled_;
  Clock& clock_;
  // This rank's endpoint to the store, kept from step to step (see UcxPeerCache).
  transfer::UcxPeerCache peers_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_STEP_PUBLISHER_H_
