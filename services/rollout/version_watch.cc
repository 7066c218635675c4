#include "services/rollout/version_watch.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "common/proto_time.h"

namespace tandem::rollout {

namespace {

VersionWatch::Announcement AsAnnouncement(const weightstore::v1::WatchVersionsResponse& message) {
  VersionWatch::Announcement announcement;
  *announcement.mutable_announcement() = message;
  return announcement;
}

const VersionWatch::Announcement& AsAnnouncement(const VersionWatch::Announcement& message) {
  return message;
}

// `on_event` with each lease's end as this replica can trust it: the store's end (its clock)
// bounded by arrival + ttl here, less a tenth of the ttl for clock skew and time in buffers.
VersionWatch::OnEvent WithLocalLeaseEnds(VersionWatch::OnEvent on_event, absl::Duration ttl) {
  return [on_event = std::move(on_event), ttl](const VersionWatch::Announcement& announced) {
    if (announced.lease_id().empty()) return on_event(announced);
    VersionWatch::Announcement local = announced;
    const absl::Time end =
        std::min(FromTimestamp(announced.lease_expire_time()), absl::Now() + ttl) - ttl / 10;
    *local.mutable_lease_expire_time() = ToTimestamp(end);
    on_event(local);
  };
}

}  // namespace

// Deletes itself when the call is done; keeps the watch (and so its ClientContext) and the
// request alive until then.
template <typename Request, typename Response>
class VersionWatch::Reactor final : public grpc::ClientReadReactor<Response> {
 public:
  using Open =
      std::function<void(grpc::ClientContext*, const Request*, grpc::ClientReadReactor<Response>*)>;

  Reactor(std::shared_ptr<VersionWatch> watch, Request request, OnEvent on_event, OnEnd on_end,
          CallTracker& calls)
      : call_(calls),
        watch_(std::move(watch)),
        request_(std::move(request)),
        on_event_(std::move(on_event)),
        on_end_(std::move(on_end)) {}

  // `open` starts the call on this reactor (the stub's async WatchVersions or WatchReadPlans).
  void Begin(const Open& open) {
    open(&watch_->context_, &request_, this);
    this->StartRead(&response_);
    this->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended: OnDone follows with its status.
    on_event_(AsAnnouncement(response_));
    this->StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    on_end_(status);
    delete this;
  }

 private:
  // Declared first, so released last: whatever the callbacks hold is gone before the owner
  // waiting for its calls to end may go away.
  const CallTracker::Token call_;
  const std::shared_ptr<VersionWatch> watch_;
  const Request request_;
  const OnEvent on_event_;
  const OnEnd on_end_;
  Response response_;
};

void VersionWatch::Start(const weight_store::WeightStoreStubs& stubs, const std::string& adapter,
                         std::optional<internal::v1::WatchReadPlansRequest> plans, OnEvent on_event,
                         OnEnd on_end, CallTracker& calls) {
  if (plans.has_value()) {
    plans->set_adapter_name(adapter);
    const absl::Duration ttl =
        plans->has_lease_ttl() ? absl::Seconds(plans->lease_ttl().seconds()) : absl::Seconds(30);
    using PlansReactor = Reactor<internal::v1::WatchReadPlansRequest, Announcement>;
    (new PlansReactor(shared_from_this(), *std::move(plans),
                      WithLocalLeaseEnds(std::move(on_event), ttl), std::move(on_end), calls))
        ->Begin([&stubs](grpc::ClientContext* context,
                         const internal::v1::WatchReadPlansRequest* request,
                         grpc::ClientReadReactor<Announcement>* reactor) {
          stubs.ucx().async()->WatchReadPlans(context, request, reactor);
        });
    return;
  }
  weightstore::v1::WatchVersionsRequest request;
  request.set_adapter_name(adapter);
  using VersionsReactor =
      Reactor<weightstore::v1::WatchVersionsRequest, weightstore::v1::WatchVersionsResponse>;
  (new VersionsReactor(shared_from_this(), std::move(request), std::move(on_event),
                       std::move(on_end), calls))
      ->Begin([&stubs](grpc::ClientContext* context,
                       const weightstore::v1::WatchVersionsRequest* request,
                       grpc::ClientReadReactor<weightstore::v1::WatchVersionsResponse>* reactor) {
        stubs.api().async()->WatchVersions(context, request, reactor);
      });
}

}  // namespace tandem::rollout
