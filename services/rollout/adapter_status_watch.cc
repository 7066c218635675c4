#include "services/rollout/adapter_status_watch.h"

#include <utility>

#include "common/status.h"

namespace tandem::rollout {

AdapterStatusWatch::AdapterStatusWatch(const AdapterRegistry& registry, std::string adapter,
                                       std::string replica_id)
    : registry_(registry), adapter_(std::move(adapter)), replica_id_(std::move(replica_id)) {
  listener_ = registry_.status_listeners().Add(
      adapter_,
      {.on_change = [this] { return OfferStatus(); },
       .on_end = [sink =
                      sink()](const absl::Status& status) { sink->Finish(ToGrpcStatus(status)); }});
}

void AdapterStatusWatch::Enqueue(std::deque<rollout::v1::WatchAdapterStatusResponse>& queue,
                                 rollout::v1::WatchAdapterStatusResponse message) {
  queue.clear();
  queue.push_back(std::move(message));
}

void AdapterStatusWatch::OnClientGone() { registry_.status_listeners().Remove(listener_); }

bool AdapterStatusWatch::OfferStatus() {
  absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> status = registry_.Status(adapter_);
  if (!status.ok() || status->empty()) return false;  // Unfollowed: the stream ends NOT_FOUND.
  std::string serialized = status->front().SerializeAsString();
  if (serialized == last_offered_) return true;
  last_offered_ = std::move(serialized);
  rollout::v1::WatchAdapterStatusResponse response;
  response.set_replica_id(replica_id_);
  *response.mutable_status() = std::move(status->front());
  sink()->Write(std::move(response));
  return true;
}

}  // namespace tandem::rollout
