#include "services/weight_store/weight_store_ucx_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/finished_reactor.h"
#include "common/identifier.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "common/unary.h"
#include "services/weight_store/announcement_stream.h"
#include "services/weight_store/lease_ttl.h"
#include "services/weight_store/weight_store_metrics.h"

namespace tandem::weight_store {

namespace {

// Streams WatchVersions' announcements, each with a lease on its version taken for the reader and
// the version's read plan in the reader's layout. A slow reader skips to the newest version: the
// store releases the leases of the announcements it never sends.
class WatchPlansReactor final : public AnnouncementStream<internal::v1::WatchReadPlansResponse> {
 public:
  WatchPlansReactor(AdapterStore& store, ReadPlanner& planner,
                    OpenStreams<internal::v1::WatchReadPlansResponse>& open,
                    const internal::v1::WatchReadPlansRequest& request, absl::Duration ttl)
      : AnnouncementStream(store, open) {
    const auto announce = [&store, &planner, request, ttl](
                              const weightstore::v1::VersionInfo& version,
                              weightstore::v1::VersionEventType type) {
      return Announce(store, planner, request, ttl, version, type);
    };
    // The store may call a listener once more after Unwatch (it calls them outside its lock),
    // when the stream is gone: that announcement's lease is given back here.
    watch_id_ = store_.Watch(
        request.adapter_name(),
        [announce, &store, sink = sink()](const weightstore::v1::VersionInfo& version) {
          internal::v1::WatchReadPlansResponse event =
              announce(version, weightstore::v1::VERSION_EVENT_TYPE_COMMITTED);
          const std::string lease_id = event.lease_id();
          if (!sink->Write(std::move(event)) && !lease_id.empty()) store.ReleaseLease(lease_id);
        });
    internal::v1::WatchReadPlansResponse snapshot = announce(
        store_.Newest(request.adapter_name()), weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT);
    snapshot.mutable_announcement()->set_upload_open(store_.HasOpenUpload(request.adapter_name()));
    sink()->Write(std::move(snapshot));
    open_id_ = open_.Add(sink());
  }

 private:
  // `version` announced, with a lease and a plan when the store can lease and plan it.
  static internal::v1::WatchReadPlansResponse Announce(
      AdapterStore& store, ReadPlanner& planner, const internal::v1::WatchReadPlansRequest& request,
      absl::Duration ttl, const weightstore::v1::VersionInfo& version,
      weightstore::v1::VersionEventType type) {
    internal::v1::WatchReadPlansResponse event;
    event.mutable_announcement()->set_type(type);
    *event.mutable_announcement()->mutable_version() = version;
    if (version.version() < 1) return event;
    absl::StatusOr<AdapterStore::Lease> lease =
        store.AcquireLease(request.adapter_name(), version.version(), request.holder(), ttl);
    if (!lease.ok()) return event;  // Retired already: the reader fetches the usual way.
    internal::v1::GetReadPlanRequest plan_request;
    plan_request.set_adapter_name(request.adapter_name());
    plan_request.set_version(version.version());
    *plan_request.mutable_target() = request.target();
    *plan_request.mutable_tensor_names() = request.tensor_names();
    plan_request.set_shard_checksums(request.shard_checksums());
    plan_request.set_lease_id(lease->id);
    absl::StatusOr<internal::v1::GetReadPlanResponse> plan = planner.Plan(plan_request);
    if (!plan.ok()) {
      spdlog::warn("no read plan pushed for {}@{}: {}", request.adapter_name(), version.version(),
                   plan.status().ToString());
      store.ReleaseLease(lease->id);
      return event;
    }
    event.set_lease_id(lease->id);
    *event.mutable_lease_expire_time() = ToTimestamp(lease->expire_time);
    *event.mutable_plan() = *std::move(plan);
    return event;
  }

  // As WatchVersions: the first event out is the snapshot, every later one a newer commit; an
  // announcement dropped here (older, or overtaken in the queue) gives its lease back.
  void Enqueue(std::deque<internal::v1::WatchReadPlansResponse>& queue,
               internal::v1::WatchReadPlansResponse event) override {
    const std::optional<weightstore::v1::VersionEventType> type =
        announced_.Offer(event.announcement().version().version());
    if (!type.has_value()) {
      Release(event);
      return;
    }
    event.mutable_announcement()->set_type(*type);
    for (const internal::v1::WatchReadPlansResponse& overtaken : queue) Release(overtaken);
    queue.clear();
    queue.push_back(std::move(event));
  }

  void Discard(const internal::v1::WatchReadPlansResponse& event) override { Release(event); }

  void Release(const internal::v1::WatchReadPlansResponse& event) {
    if (!event.lease_id().empty()) store_.ReleaseLease(event.lease_id());
  }
};

// INVALID_ARGUMENT for a WatchReadPlans request no announcement could serve.
absl::StatusOr<absl::Duration> CheckWatchRequest(
    const internal::v1::WatchReadPlansRequest& request) {
  if (absl::Status status = ValidateIdentifier("adapter_name", request.adapter_name());
      !status.ok()) {
    return status;
  }
  if (request.holder().empty()) return InvalidField("holder", "holder is required");
  if (absl::Status status = CheckMaxBytes("holder", request.holder(), kMaxNameBytes);
      !status.ok()) {
    return status;
  }
  if (!request.has_target()) return InvalidField("target", "target is required");
  if (request.target().dtype() != type::v1::DTYPE_UNSPECIFIED) {
    return InvalidField("target.dtype", "read plans never convert: leave target.dtype unset");
  }
  return LeaseTtl(request.has_lease_ttl(), request.lease_ttl(), "lease_ttl");
}

}  // namespace

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
      return InvalidField("worker_address",
                          absl::StrCat("worker_address has ", request->worker_address().size(),
                                       " bytes; allowed 1 B..64 KiB"));
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

grpc::ServerWriteReactor<internal::v1::WatchReadPlansResponse>*
WeightStoreUcxServiceImpl::WatchReadPlans(grpc::CallbackServerContext* /*context*/,
                                          const internal::v1::WatchReadPlansRequest* request) {
  absl::StatusOr<absl::Duration> ttl = CheckWatchRequest(*request);
  absl::Status status = ttl.ok() ? CheckUcx() : ttl.status();
  if (!status.ok()) {
    return new FinishedReactor<grpc::ServerWriteReactor<internal::v1::WatchReadPlansResponse>>(
        ToGrpcStatus(status));
  }
  return new WatchPlansReactor(*store_, *planner_, watches_, *request, *ttl);
}

void WeightStoreUcxServiceImpl::Drain() { watches_.EndAll(DrainingStatus("weight-store")); }

}  // namespace tandem::weight_store
