#include "services/rollout/adapter_loader.h"

#include <utility>

#include "common/status.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::rollout {

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterLoader::Load(
    const std::string& adapter, int64_t version, weight_store::AdapterFetcher& fetcher,
    weight_store::FetchedAdapter& fetched) const {
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
  if (absl::Status status = fetcher.FetchInto(adapter, version,
                                              {.target = weight_store::EngineTargetLayout(),
                                               .ucx = options_.ucx,
                                               .holder = options_.holder,
                                               .timeout = options_.fetch_timeout},
                                              fetched);
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
