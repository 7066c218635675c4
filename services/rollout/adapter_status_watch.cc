#include "services/rollout/adapter_status_watch.h"

#include <utility>

namespace tandem::rollout {

AdapterStatusWatch::AdapterStatusWatch(const AdapterRegistry& registry, std::string adapter,
                                       std::string replica_id)
    : registry_(registry), adapter_(std::move(adapter)), replica_id_(std::move(replica_id)) {
  listener_ = registry_.status_listeners().Add(
      adapter_, {.on_change = [this] { OfferStatus(); },
                 .on_end =
                     [sink = sink()] {
                       sink->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                 "the rollout replica is draining"));
                     }});
}

void AdapterStatusWatch::Enqueue(std::deque<rollout::v1::WatchAdapterStatusResponse>& queue,
                                 rollout::v1::WatchAdapterStatusResponse message) {
  queue.clear();
  queue.push_back(std::move(message));
}

void AdapterStatusWatch::OnClientGone() { registry_.status_listeners().Remove(listener_); }

void AdapterStatusWatch::OfferStatus() {
  absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> status = registry_.Status(adapter_);
  // Unfollowed since (idle): nothing changes any more; the client's deadline ends the call.
  if (!status.ok() || status->empty()) return;
  std::string serialized = status->front().SerializeAsString();
  if (serialized == last_offered_) return;
  last_offered_ = std::move(serialized);
  rollout::v1::WatchAdapterStatusResponse response;
  response.set_replica_id(replica_id_);
  *response.mutable_status() = std::move(status->front());
  sink()->Write(std::move(response));
}

}  // namespace tandem::rollout
