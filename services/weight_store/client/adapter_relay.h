#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_RELAY_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_RELAY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/internal/v1/adapter_relay.grpc.pb.h"

namespace tandem::weight_store {

// One version as a reader receives it, chunk by chunk, for relaying to the next reader while
// it still arrives. Thread-safe: one writer, any number of readers.
class VersionChunks {
 public:
  void Append(weightstore::v1::FetchTensorsResponse chunk);
  // The version is whole (OK), or its source failed.
  void Finish(absl::Status status);
  // Chunk `index` once it has arrived (valid as long as this object); nullptr once the version
  // ended OK with fewer chunks; the source's failure; DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<const weightstore::v1::FetchTensorsResponse*> Wait(size_t index,
                                                                    absl::Time deadline);

 private:
  absl::Mutex mutex_;
  std::deque<weightstore::v1::FetchTensorsResponse> chunks_ ABSL_GUARDED_BY(mutex_);
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mutex_);
};

// The versions a reader received or is receiving in its layout, the newest `keep` per adapter.
class RelayedVersions {
 public:
  explicit RelayedVersions(weightstore::v1::TargetLayout layout, int keep = 2)
      : layout_(std::move(layout)), keep_(keep) {}

  const weightstore::v1::TargetLayout& layout() const { return layout_; }
  // A version this reader starts to receive (again, after a failed try: the new chunks replace
  // the old ones for readers that ask from now on).
  std::shared_ptr<VersionChunks> Begin(const std::string& adapter, int64_t version);
  // Drops `chunks`, a failed try at the version, if they are still its newest: readers that ask
  // from now on wait for the next try's.
  void Forget(const std::string& adapter, int64_t version,
              const std::shared_ptr<VersionChunks>& chunks);
  // The version's chunks once this reader has begun to receive it; DEADLINE_EXCEEDED at
  // `deadline`; NOT_FOUND at once when a newer version of the adapter began here (this reader
  // skipped it, or let it go).
  absl::StatusOr<std::shared_ptr<VersionChunks>> Await(const std::string& adapter, int64_t version,
                                                       absl::Time deadline);

 private:
  const weightstore::v1::TargetLayout layout_;
  const int keep_;
  absl::Mutex mutex_;
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<VersionChunks>> versions_
      ABSL_GUARDED_BY(mutex_);
};

// Serves AdapterRelayService from `versions`: each chunk as soon as this reader has it. A
// stream blocks one of the server's threads while it waits for chunks (a chain has one
// downstream reader per relay).
class AdapterRelayServiceImpl final : public internal::v1::AdapterRelayService::Service {
 public:
  // `wait`: how long a request for a version this reader has not begun to receive waits.
  // `heartbeat`: while a stream waits (for the version to begin, or for its next chunk), it
  // sends an empty message this often.
  AdapterRelayServiceImpl(RelayedVersions& versions, absl::Duration wait,
                          absl::Duration heartbeat = absl::Seconds(1))
      : versions_(versions), wait_(wait), heartbeat_(heartbeat) {}

  grpc::Status Relay(grpc::ServerContext* context, const internal::v1::RelayRequest* request,
                     grpc::ServerWriter<weightstore::v1::FetchTensorsResponse>* writer) override;

 private:
  RelayedVersions& versions_;
  const absl::Duration wait_;
  const absl::Duration heartbeat_;
};

struct RelayFetchOptions {
  // The relay this reader reads from (the previous reader of a chain); null: the store.
  internal::v1::AdapterRelayService::StubInterface* upstream = nullptr;
  // The pieces a relay forwards, so what each hop of a chain adds to a refit: the chunks
  // received (the store's are at least 1 MiB) are cut to this size before they are relayed.
  uint32_t chunk_bytes = 256 << 10;
  // An upstream relay that sends nothing for this long (it stalled, or waits for a version it
  // will not get) is given up for the store.
  absl::Duration relay_stall = absl::Seconds(10);
  absl::Duration timeout = absl::Minutes(10);
};

enum class FetchedFrom { kRelay, kStore };

// Fetches `version` in `versions`' layout from the upstream relay, or from the store by the
// FetchTensors stream when there is none or it fails, recording every chunk in `versions` as it
// arrives (so this reader relays it on at once) and verifying every tensor into `fetched`.
// Returns where the version came from.
//
// A try that fails partway and is followed by another ends, for this reader's own readers, in
// ABORTED ("ask again"), and they ask once more before they turn to the store: the next try is
// relayed to them, so a relay lost in the middle of a chain sends one reader, not every one
// after it, to the store.
absl::StatusOr<FetchedFrom> FetchRelaying(const WeightStoreStubs& store, RelayedVersions& versions,
                                          const std::string& adapter, int64_t version,
                                          const RelayFetchOptions& options,
                                          FetchedAdapter& fetched);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_RELAY_H_
