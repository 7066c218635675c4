#include "services/weight_store/weight_store_ucx_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/proto_time.h"
#include "common/unary.h"
#include "services/weight_store/weight_store_metrics.h"

namespace tandem::weight_store {

WeightStoreUcxServiceImpl::WeightStoreUcxServiceImpl(std::shared_ptr<transfer::UcxWorker> ucx,
                                                     std::shared_ptr<AdapterStore> store)
    : ucx_(std::move(ucx)),
      store_(std::move(store)),
      planner_(ucx_ == nullptr ? nullptr : std::make_unique<ReadPlanner>(*ucx_, *store_)) {}

absl::Status WeightStoreUcxServiceImpl::CheckUcx() const {
  if (ucx_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this weight-store runs without UCX; use the gRPC data path (PutShard, FetchTensors)");
}

grpc::ServerUnaryReactor* WeightStoreUcxServiceImpl::BeginUcxPublish(
    grpc::CallbackServerContext* context, const internal::v1::BeginUcxPublishRequest* request,
    internal::v1::BeginUcxPublishResponse* response) {
  const auto begin = [&]() -> absl::StatusOr<internal::v1::BeginUcxPublishResponse> {
    if (absl::Status status = CheckUcx(); !status.ok()) return status;
    absl::StatusOr<BeginResult> begun = store_->Begin(request->manifest(), /*use_ucx=*/true);
    if (!begun.ok()) return begun.status();
    internal::v1::BeginUcxPublishResponse result;
    result.set_upload_id(begun->upload_id);
    *result.mutable_expire_time() = ToTimestamp(begun->expire_time);
    for (size_t i = 0; i < begun->shards.size(); ++i) {
      *result.add_targets() = ShardRegionOf(static_cast<int32_t>(i), *begun->shards[i]->region());
    }
    result.set_store_worker_address(ucx_->address());
    WeightStoreMetrics::Get().RecordTotals(store_->totals());
    return result;
  };
  return FinishUnary(context, begin(), response);
}

grpc::ServerUnaryReactor* WeightStoreUcxServiceImpl::GetReadPlan(
    grpc::CallbackServerContext* context, const internal::v1::GetReadPlanRequest* request,
    internal::v1::GetReadPlanResponse* response) {
  const absl::Time start = absl::Now();
  const auto plan_of = [&]() -> absl::StatusOr<internal::v1::GetReadPlanResponse> {
    if (absl::Status status = CheckUcx(); !status.ok()) return status;
    return planner_->Plan(*request);
  };
  absl::StatusOr<internal::v1::GetReadPlanResponse> plan = plan_of();
  if (plan.ok()) {
    int64_t bytes = 0;
    for (const internal::v1::PlannedTensor& tensor : plan->tensors()) {
      bytes += static_cast<int64_t>(tensor.tensor().byte_size());
    }
    WeightStoreMetrics::Get().RecordOut(Transport::kUcx, bytes);
    WeightStoreMetrics::Get().fetch_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return FinishUnary(context, std::move(plan), response);
}

grpc::ServerUnaryReactor* WeightStoreUcxServiceImpl::ExchangeUcxEndpoint(
    grpc::CallbackServerContext* context, const internal::v1::ExchangeUcxEndpointRequest* request,
    internal::v1::ExchangeUcxEndpointResponse* response) {
  const auto exchange = [&]() -> absl::StatusOr<internal::v1::ExchangeUcxEndpointResponse> {
    if (absl::Status status = CheckUcx(); !status.ok()) return status;
    if (request->worker_address().empty() || request->worker_address().size() > (64 << 10)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker_address has ", request->worker_address().size(), " bytes; allowed 1 B..64 KiB"));
    }
    if (absl::Status status = ValidateIdentifier("client_id", request->client_id()); !status.ok()) {
      return status;
    }
    // One-sided gets and puts need only the client's endpoint to the store; the store keeps
    // no per-client state.
    internal::v1::ExchangeUcxEndpointResponse result;
    result.set_worker_address(ucx_->address());
    return result;
  };
  return FinishUnary(context, exchange(), response);
}

}  // namespace tandem::weight_store
