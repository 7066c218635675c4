#ifndef TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCED_VERSIONS_H_
#define TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCED_VERSIONS_H_

#include <cstdint>
#include <optional>

#include "tandem/weightstore/v1/weight_store.pb.h"

namespace tandem::weight_store {

// Which versions offered to a watch stream it announces: the first, as the snapshot, then only
// newer ones as commits, so a slow reader skips to the newest version.
class AnnouncedVersions {
 public:
  // The type `version` goes out as; nullopt when it is no newer than one offered before.
  std::optional<weightstore::v1::VersionEventType> Offer(int64_t version) {
    if (sent_any_ && version <= newest_) return std::nullopt;
    const weightstore::v1::VersionEventType type =
        sent_any_ ? weightstore::v1::VERSION_EVENT_TYPE_COMMITTED
                  : weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT;
    sent_any_ = true;
    newest_ = version;
    return type;
  }

 private:
  bool sent_any_ = false;
  int64_t newest_ = 0;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_ANNOUNCED_VERSIONS_H_
