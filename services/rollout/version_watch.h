#ifndef TANDEM_SERVICES_ROLLOUT_VERSION_WATCH_H_
#define TANDEM_SERVICES_ROLLOUT_VERSION_WATCH_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/call_tracker.h"
#include "grpcpp/grpcpp.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/internal/v1/weight_store_ucx.grpc.pb.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"

namespace tandem::rollout {

// One adapter's watch stream on gRPC's callback API: it holds an HTTP/2 stream and no thread,
// so the threads of a replica do not grow with the adapters it follows (the source of
// AdapterRegistry, in TF Serving's terms). Either WatchVersions, or, for a replica fetching by
// UCX, the internal WatchReadPlans, whose announcements bring a lease and a read plan.
class VersionWatch : public std::enable_shared_from_this<VersionWatch> {
 public:
  // An announcement: WatchVersions' message, with a lease and a plan from WatchReadPlans.
  using Announcement = internal::v1::WatchReadPlansResponse;
  using OnEvent = std::function<void(const Announcement&)>;
  using OnEnd = std::function<void(const grpc::Status&)>;

  // Made first and started second, so that its owner can record it before any callback runs.
  static std::shared_ptr<VersionWatch> Create() {
    return std::shared_ptr<VersionWatch>(new VersionWatch());
  }
  // Opens the stream: WatchReadPlans with `plans` (for `adapter`) when given, else
  // WatchVersions (each lease's expire time in the announcements `on_event` gets is the store's
  // bounded by its arrival here plus the ttl asked for, less a tenth of that ttl); `on_event` runs
  // for each message, then `on_end` once with the stream's status, after which nothing runs; both
  // on gRPC's threads, one at a time. `calls` counts the stream until `on_end` has returned (an
  // owner waits for it before going away). At most once.
  void Start(const weight_store::WeightStoreStubs& stubs, const std::string& adapter,
             std::optional<internal::v1::WatchReadPlansRequest> plans, OnEvent on_event,
             OnEnd on_end, CallTracker& calls);
  // Ends the stream (`on_end` follows, CANCELLED); thread-safe, at any time, before Start too.
  // Never call it holding a lock that the callbacks take: gRPC may run them inline.
  void Cancel() { context_.TryCancel(); }

 private:
  template <typename Request, typename Response>
  class Reactor;
  VersionWatch() = default;
  grpc::ClientContext context_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_VERSION_WATCH_H_
