#ifndef TANDEM_SERVICES_ROLLOUT_ADAPTER_STATUS_WATCH_H_
#define TANDEM_SERVICES_ROLLOUT_ADAPTER_STATUS_WATCH_H_

#include <cstdint>
#include <deque>
#include <string>

#include "common/queued_write_reactor.h"
#include "services/rollout/adapter_registry.h"
#include "services/rollout/status_listeners.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

// One WatchAdapterStatus stream: the adapter's status now, then after each change the registry
// tells its StatusListeners of, coalesced while a write is in flight. It ends NOT_FOUND once the
// replica unfollows the adapter, UNAVAILABLE on a drain (StatusListeners::EndAll). Costs no
// thread.
class AdapterStatusWatch final
    : public QueuedWriteReactor<rollout::v1::WatchAdapterStatusResponse> {
 public:
  // `registry` must follow `adapter` and outlive the call.
  AdapterStatusWatch(const AdapterRegistry& registry, std::string adapter, std::string replica_id);

 private:
  // A slow reader gets the newest status, never a backlog.
  void Enqueue(std::deque<rollout::v1::WatchAdapterStatusResponse>& queue,
               rollout::v1::WatchAdapterStatusResponse message) override;
  void OnClientGone() override;
  // Queues the adapter's status unless it is the one queued last; false once the adapter is not
  // followed any more. Listener calls are serialized.
  bool OfferStatus();

  const AdapterRegistry& registry_;
  const std::string adapter_;
  const std::string replica_id_;
  std::string last_offered_;  // The serialized status offered last.
  int64_t listener_ = 0;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ADAPTER_STATUS_WATCH_H_
