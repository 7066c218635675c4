#include "services/rollout/adapter_loader.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "services/rollout/rollout_metrics.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::rollout {

std::optional<internal::v1::WatchReadPlansRequest> AdapterLoader::PlansRequest() const {
  if (options_.ucx == nullptr) return std::nullopt;
  internal::v1::WatchReadPlansRequest request;
  *request.mutable_target() = weight_store::EngineTargetLayout();
  request.set_holder(options_.holder);
  request.set_shard_checksums(true);  // AdapterFetcher verifies shards.
  const absl::Duration ttl =
      std::clamp(options_.fetch_timeout, absl::Seconds(1), absl::Seconds(600));
  request.mutable_lease_ttl()->set_seconds(absl::ToInt64Seconds(ttl));
  return request;
}

absl::Status AdapterLoader::Fetch(const std::string& adapter, int64_t version,
                                  const internal::v1::WatchReadPlansResponse* announced,
                                  weight_store::AdapterFetcher& fetcher,
                                  weight_store::FetchedAdapter& fetched) const {
  absl::StatusOr<weight_store::FetchedFrom> from = weight_store::FetchedFrom::kStore;
  if (options_.relayed != nullptr) {
    from = weight_store::FetchRelaying(
        weight_store_, *options_.relayed, adapter, version,
        {.upstream = options_.relay_from, .timeout = options_.fetch_timeout}, fetched);
  } else {
    const weight_store::FetchOptions options{.target = weight_store::EngineTargetLayout(),
                                             .ucx = options_.ucx,
                                             .holder = options_.holder,
                                             .timeout = options_.fetch_timeout};
    if (absl::Status status = announced != nullptr
                                  ? fetcher.FetchAnnounced(adapter, *announced, options, fetched)
                                  : fetcher.FetchInto(adapter, version, options, fetched);
        !status.ok()) {
      from = status;
    }
  }
  if (!from.ok()) return from.status();
  RolloutMetrics::Get()
      .adapter_fetches
      .Add({{"source", *from == weight_store::FetchedFrom::kRelay ? "relay" : "store"}})
      .Increment();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterLoader::Load(
    const std::string& adapter, int64_t version,
    const internal::v1::WatchReadPlansResponse* announced, weight_store::AdapterFetcher& fetcher,
    weight_store::FetchedAdapter& fetched) const {
  // The fetch first: it gives an announcement's lease back whatever happens.
  if (absl::Status status = Fetch(adapter, version, announced, fetcher, fetched); !status.ok()) {
    return status;
  }
  weightstore::v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name(adapter);
  request.mutable_adapter()->set_exact_version(version);
  weightstore::v1::GetManifestResponse manifest;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.fetch_timeout));
  if (absl::Status status =
          FromGrpcStatus(weight_store_.api().GetManifest(&context, request, &manifest));
      !status.ok()) {
    return status;
  }
  auto lora = weight_store::AdapterFromFetched(base_.config(), manifest.manifest().lora(), fetched);
  if (!lora.ok()) return lora.status();
  auto model = std::make_shared<ServedModel>();
  model->adapter = adapter;
  model->version = version;
  model->lora = std::make_unique<engine::LoraAdapter>(
      // LoRA stays bf16 beside FP8 base weights, as inference engines apply it.
      options_.precision == engine::Precision::kF32 ? *std::move(lora) : lora->RoundedToBf16());
  absl::StatusOr<std::unique_ptr<engine::DecodeEngine>> engine =
      options_.make_engine(base_, model->lora.get());
  if (!engine.ok()) return engine.status();
  model->engine = *std::move(engine);
  return model;
}

}  // namespace tandem::rollout
