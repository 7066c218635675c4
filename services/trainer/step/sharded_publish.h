#ifndef TANDEM_SERVICES_TRAINER_SHARDED_PUBLISH_H_
#define TANDEM_SERVICES_TRAINER_SHARDED_PUBLISH_H_

#include <functional>

#include "absl/status/status.h"
#include "common/communicator.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::trainer {

// Runs a weight-store call, riding out an outage of the store (JobRun::RideOutOutage).
using StoreCall = std::function<absl::Status(const std::function<absl::Status()>& call)>;

// Publishes one version from all of a job's data-parallel ranks (collective): rank 0 begins the
// upload with the manifest of every shard, each rank r puts shard r of `published` (which has one
// shard per rank), and rank 0 commits once every rank has put its shard -- or aborts the upload
// when one could not, so the version is committed whole or not at all. Every rank returns the
// outcome: OK, its own error, or ABORTED naming the ranks that failed. Rank 0's begin and commit
// go through `store_call`, which the others wait for up to `wait`; a put is not retried (the
// step fails). An upload that a broken group leaves open expires on the store.
absl::Status PublishTogether(Communicator& ranks, const weight_store::WeightStoreStubs& stub,
                             const weight_store::AdapterVersion& published,
                             const weight_store::PublishOptions& options,
                             const StoreCall& store_call, absl::Duration wait);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_SHARDED_PUBLISH_H_
