#ifndef TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCEMENT_STREAM_H_
#define TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCEMENT_STREAM_H_

#include <cstdint>

#include "common/open_streams.h"
#include "common/queued_write_reactor.h"
#include "services/weight_store/adapter_store.h"
#include "services/weight_store/announced_versions.h"

namespace tandem::weight_store {

// What WatchVersions and WatchReadPlans streams share: a watcher registered with the store
// (watch_id_) and an entry among the open streams (open_id_), both set by the subclass's
// constructor and removed when the client goes, and the rule of which versions go out.
template <typename Response>
class AnnouncementStream : public QueuedWriteReactor<Response> {
 protected:
  AnnouncementStream(AdapterStore& store, OpenStreams<Response>& open)
      : store_(store), open_(open) {}

  void OnClientGone() override {
    store_.Unwatch(watch_id_);
    open_.Remove(open_id_);
  }

  AdapterStore& store_;
  OpenStreams<Response>& open_;
  int64_t watch_id_ = 0;
  int64_t open_id_ = 0;
  AnnouncedVersions announced_;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCEMENT_STREAM_H_
