#ifndef TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_CLIENT_H_
#define TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_CLIENT_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tandem/internal/v1/weight_store_ucx.grpc.pb.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"
#include "transfer/ucx_peer_cache.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

// The UCX data plane's service, for a channel's ChannelOptions::also_services (retries).
inline constexpr char kUcxServiceName[] = "tandem.internal.v1.WeightStoreUcxService";

// The weight-store's two services, reached on one channel: its public API and the UCX data
// plane that only Tandem's services use (tandem.internal.v1.WeightStoreUcxService).
class WeightStoreStubs {
 public:
  explicit WeightStoreStubs(const std::shared_ptr<grpc::ChannelInterface>& channel)
      : api_(weightstore::v1::WeightStoreService::NewStub(channel)),
        ucx_(internal::v1::WeightStoreUcxService::NewStub(channel)) {}

  weightstore::v1::WeightStoreService::StubInterface& api() const { return *api_; }
  internal::v1::WeightStoreUcxService::StubInterface& ucx() const { return *ucx_; }

 private:
  std::unique_ptr<weightstore::v1::WeightStoreService::StubInterface> api_;
  std::unique_ptr<internal::v1::WeightStoreUcxService::StubInterface> ucx_;
};

// Where an upload's bytes go: its id and, when it was begun for UCX, the store's shard regions
// and worker address.
using Upload = internal::v1::BeginUcxPublishResponse;

struct PublishOptions {
  // Put the shard bytes by UCX into the store's memory; null: PutShard streams over gRPC.
  transfer::UcxWorker* ucx = nullptr;
  // Keeps the endpoint to the store from publish to publish (see UcxPeerCache); null: a
  // connection per publish.
  transfer::UcxPeerCache* peers = nullptr;
  size_t grpc_chunk_bytes = size_t{4} << 20;
  absl::Duration timeout = absl::Minutes(10);
};

// The manifest of `adapter`'s `version`, or of its newest version when `version` is 0; NOT_FOUND
// when the store holds no such version.
absl::StatusOr<weightstore::v1::Manifest> GetManifest(const WeightStoreStubs& store,
                                                      absl::string_view adapter, int64_t version,
                                                      absl::Duration timeout);

// The trainer's side: publishes one version (BeginPublish, the bytes, CommitPublish) and aborts
// the upload if anything fails, so a version is either committed whole or not at all.
absl::StatusOr<weightstore::v1::VersionInfo> PublishAdapter(
    const WeightStoreStubs& store,
    const weightstore::v1::Manifest& manifest, const std::vector<absl::string_view>& shards,
    const PublishOptions& options);

// A version published by many writers (a job's trainer ranks), in parts: one writer begins the
// upload (its manifest names every shard), each puts the shards it holds, and the first commits
// once all have put theirs -- CommitPublish refuses an upload with bytes missing, so a writer
// that died leaves the version uncommitted -- or aborts it.
// By UCX (BeginUcxPublish, into registered memory) or for PutShard (BeginPublish).
absl::StatusOr<Upload> BeginUpload(const WeightStoreStubs& store,
                                   const weightstore::v1::Manifest& manifest, bool use_ucx);
// Puts shards[i] for each i in `which` (indices into the upload's manifest shards), by UCX when
// options.ucx is set (the upload must have begun with use_ucx), else over gRPC.
absl::Status PutShards(const WeightStoreStubs& store,
                       const Upload& begun,
                       const std::vector<absl::string_view>& shards, absl::Span<const int> which,
                       const PublishOptions& options);
absl::StatusOr<weightstore::v1::VersionInfo> CommitUpload(
    const WeightStoreStubs& store, const std::string& upload_id,
    const PublishOptions& options);
// Best effort: an upload not aborted expires on the store.
void AbortUpload(const WeightStoreStubs& store,
                 const std::string& upload_id);

struct FetchOptions {
  weightstore::v1::TargetLayout target;
  std::vector<std::string> tensor_names;  // Empty: all.
  // Get straight from the store's memory by UCX; null (or a store without UCX, or a UCX
  // failure) uses the FetchTensors stream.
  transfer::UcxWorker* ucx = nullptr;
  std::string holder = "tandem-client";  // Names the lease the UCX path takes.
  absl::Duration timeout = absl::Minutes(10);
};

struct FetchedTensor {
  weightstore::v1::TargetTensor tensor;
  std::string bytes;
};

struct FetchedAdapter {
  // In name order, each verified: against its xxh3_64, or, from a read plan with verify_shards
  // (xxh3_64 unset), as part of the shards it came from.
  std::vector<FetchedTensor> tensors;
  bool by_ucx = false;
  // By UCX, copied out of the store's memory as mapped into this process (shared memory)
  // rather than by gets.
  bool mapped = false;
};

// A relay's heartbeat (AdapterRelayService): a message with neither a tensor header nor data.
bool IsHeartbeat(const weightstore::v1::FetchTensorsResponse& chunk);

// Receives a FetchTensors stream (the weight-store's, or a relay's: AdapterRelayService) into
// `into`, reusing its tensors' memory and verifying each tensor's xxh3 once it is whole.
// `on_chunk` sees every message as it arrives, before its tensor is verified (a relay forwards
// it), heartbeats too; they carry nothing else.
absl::Status ReceiveTensors(
    grpc::ClientReaderInterface<weightstore::v1::FetchTensorsResponse>& reader,
    grpc::ClientContext& context, FetchedAdapter& into,
    absl::FunctionRef<void(const weightstore::v1::FetchTensorsResponse&)> on_chunk);

// The rollout's side: fetches committed versions in its own layout, verifying every tensor's
// checksum (DATA_LOSS on a mismatch). Keeps its UCX endpoint to the store between fetches,
// since creating one costs a wireup round trip, and its staging memory, since fresh pages cost
// more than the transfer on these machines. Used by one thread at a time.
class AdapterFetcher {
 public:
  explicit AdapterFetcher(const WeightStoreStubs& store) : store_(store) {}
  // Waits (up to 2 s) for the lease releases still in flight, so that a short-lived fetcher
  // (a tool's) leaves no lease pinning a version until its TTL; a release still pending then
  // completes or times out on its own.
  ~AdapterFetcher();

  AdapterFetcher(const AdapterFetcher&) = delete;
  AdapterFetcher& operator=(const AdapterFetcher&) = delete;

  // Fetches into `fetched`, reusing its tensors' memory: a caller that fetches version after
  // version of one adapter into the same FetchedAdapter touches no fresh memory after the first.
  // On an error `fetched` holds no valid version.
  absl::Status FetchInto(absl::string_view adapter, int64_t version, const FetchOptions& options,
                         FetchedAdapter& fetched);
  absl::StatusOr<FetchedAdapter> Fetch(absl::string_view adapter, int64_t version,
                                       const FetchOptions& options);
  // Fetches the version a WatchReadPlans announcement names. With its lease and plan (and
  // options.ucx, options.target the layout the watch registered) the bytes move at once, with no
  // round trip to the store first, within the lease's lifetime; the lease is released after,
  // fetched or not. Without them, or on transport trouble, as FetchInto.
  absl::Status FetchAnnounced(absl::string_view adapter,
                              const internal::v1::WatchReadPlansResponse& announced,
                              const FetchOptions& options, FetchedAdapter& fetched);

 private:
  absl::Status FetchByUcx(absl::string_view adapter, int64_t version, const FetchOptions& options,
                          FetchedAdapter& fetched);
  // Runs `plan` under `lease_id` (reads done by `deadline`), then releases the lease.
  absl::Status FetchLeased(const internal::v1::GetReadPlanResponse& plan,
                           const std::string& lease_id, absl::Time deadline,
                           const FetchOptions& options, FetchedAdapter& fetched);
  // FetchInto's fallback to gRPC after a UCX fetch that failed with `status`.
  absl::Status FallBack(absl::string_view adapter, int64_t version, const FetchOptions& options,
                        const absl::Status& status, FetchedAdapter& fetched);
  absl::Status PullPlan(const internal::v1::GetReadPlanResponse& plan, transfer::UcxPeer& peer,
                        absl::Time deadline, FetchedAdapter& fetched);
  // At least `bytes` of staging memory, kept between fetches.
  char* Staging(uint64_t bytes);
  // Releases a lease without waiting for the reply.
  void ReleaseInBackground(const std::string& lease_id);
  // After a failed UCX fetch: keeps the memory its reads targeted out of further use.
  void SetAsideMemoryOf(FetchedAdapter& fetched);

  static constexpr size_t kSetAsideFetches = 2;
  struct SetAside {
    std::vector<FetchedTensor> tensors;
    std::unique_ptr<char[]> staging;
  };

  static constexpr absl::Duration kReleaseTimeout = absl::Seconds(10);
  static constexpr absl::Duration kReleaseWaitOnExit = absl::Seconds(2);
  // Lease releases in flight; shared with their callbacks, which may outlive the fetcher.
  struct PendingReleases {
    absl::Mutex mutex;
    int count ABSL_GUARDED_BY(mutex) = 0;
  };

  const WeightStoreStubs& store_;
  transfer::UcxPeerCache peers_;
  std::unique_ptr<char[]> staging_;  // Not zero-filled: gets overwrite what a fetch reads.
  uint64_t staging_bytes_ = 0;
  std::shared_ptr<PendingReleases> releases_ = std::make_shared<PendingReleases>();
  std::deque<SetAside> set_aside_;
};

// A lease on (adapter, version): while it lives (ttl, clamped to the store's 1..600 s) the store
// neither retires the version nor reuses its memory. Returns the lease id.
absl::StatusOr<std::string> AcquireLease(const WeightStoreStubs& store,
                                         absl::string_view adapter, int64_t version,
                                         absl::string_view holder, absl::Duration ttl);

// Releases a lease and waits for the reply; one that fails is left to expire at its TTL.
void ReleaseLease(const WeightStoreStubs& store,
                  const std::string& lease_id);

// One fetch with a fresh AdapterFetcher.
absl::StatusOr<FetchedAdapter> FetchAdapter(
    const WeightStoreStubs& store, absl::string_view adapter,
    int64_t version, const FetchOptions& options);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_CLIENT_ADAPTER_CLIENT_H_
