#ifndef TANDEM_SERVICES_ROLLOUT_ADAPTER_LOADER_H_
#define TANDEM_SERVICES_ROLLOUT_ADAPTER_LOADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/decode_engine.h"
#include "engine/model.h"
#include "services/rollout/served_model.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/adapter_relay.h"
#include "tandem/internal/v1/weight_store_ucx.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::rollout {

struct AdapterLoaderOptions {
  engine::Precision precision = engine::Precision::kBF16;
  // Makes each adapter version's engine (engine::MakeDecodeEngineMaker); must be set.
  engine::DecodeEngineMaker make_engine;
  // Fetch by UCX when set (and the store serves it); gRPC otherwise.
  transfer::UcxWorker* ucx = nullptr;
  std::string holder = "rollout";  // Lease holder name at the store.
  absl::Duration fetch_timeout = absl::Minutes(2);
  // Relaying (a chain of replicas): every version comes by the gRPC stream, from `relay_from`
  // (the previous replica's AdapterRelayService) or, when it is null or fails, the store, and is
  // recorded in `relayed` for the next replica as it arrives. Null: no relaying.
  weight_store::RelayedVersions* relayed = nullptr;
  internal::v1::AdapterRelayService::StubInterface* relay_from = nullptr;
};

// Fetches one adapter version from weight-store and builds the model that serves it (the
// loader of AdapterRegistry, in TF Serving's terms). Thread-safe: each caller brings its own
// fetcher and fetch memory.
class AdapterLoader {
 public:
  // `base` (already in the serving precision) and `weight_store` must outlive the loader.
  AdapterLoader(engine::BaseModel& base, const weight_store::WeightStoreStubs& weight_store,
                AdapterLoaderOptions options)
      : base_(base), weight_store_(weight_store), options_(std::move(options)) {}

  // `fetched`'s memory is reused from one version to the next. With `announced` (a
  // WatchReadPlans announcement of `version` made with PlansRequest's layout) the fetch starts
  // from its lease and plan.
  absl::StatusOr<std::shared_ptr<ServedModel>> Load(
      const std::string& adapter, int64_t version,
      const internal::v1::WatchReadPlansResponse* announced, weight_store::AdapterFetcher& fetcher,
      weight_store::FetchedAdapter& fetched) const;

  // What a watch should ask WatchReadPlans for this loader's fetches (its layout and lease
  // holder, leases as long as a fetch may take; the adapter name left to the watch); nullopt
  // when it fetches by gRPC, which plans do not serve.
  std::optional<internal::v1::WatchReadPlansRequest> PlansRequest() const;

 private:
  // Fetches by relay when relaying, else from the store (by UCX from `announced`'s plan, or
  // as FetchInto), counting where the version came from.
  absl::Status Fetch(const std::string& adapter, int64_t version,
                     const internal::v1::WatchReadPlansResponse* announced,
                     weight_store::AdapterFetcher& fetcher,
                     weight_store::FetchedAdapter& fetched) const;

  engine::BaseModel& base_;
  const weight_store::WeightStoreStubs& weight_store_;
  const AdapterLoaderOptions options_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ADAPTER_LOADER_H_
