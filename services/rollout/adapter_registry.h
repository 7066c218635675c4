#ifndef TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_
#define TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/decode_engine.h"
#include "engine/model.h"
#include "services/rollout/sequence_batch.h"
#include "services/rollout/served_model.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/rollout/v1/rollout.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::rollout {

struct AdapterRegistryOptions {
  // Versions of one adapter kept servable; older ones go once no sample uses them. The newest
  // version is always made servable, so the count is exceeded while all others are in use.
  int resident_versions = 3;
  // Adapters a replica follows at most (each holds a watch stream and two threads); a request
  // naming one more is RESOURCE_EXHAUSTED.
  int max_followed_adapters = 64;
  // A followed adapter that no request has named for this long, with nothing loading, staged or
  // in use, is unfollowed: its watch stream, threads, versions and metric series are released,
  // so a replica serving one job after another never runs into max_followed_adapters. Adapters
  // the replica was started with (Follow(..., required)) are kept.
  absl::Duration unfollow_idle_after = absl::Minutes(10);
  engine::Precision precision = engine::Precision::kBF16;
  // Makes each adapter version's engine (engine::MakeDecodeEngineMaker); must be set.
  engine::DecodeEngineMaker make_engine;
  // Fetch by UCX when set (and the store serves it); gRPC otherwise.
  transfer::UcxWorker* ucx = nullptr;
  std::string holder = "rollout";  // Lease holder name at the store.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // How often a loader waiting out a retry backoff looks whether it has ended.
  absl::Duration backoff_poll = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration fetch_timeout = absl::Minutes(2);
};

// The adapter versions a rollout replica serves. Per followed adapter, a watcher thread follows
// weight-store's WatchVersions and a loader thread fetches new versions in the background into
// staging (retrying failures with backoff while the old version keeps serving); staged versions
// become servable only in PromoteStaged, which the scheduler calls between decode steps, so a
// decode step never sees a half-loaded adapter. Thread-safe.
class AdapterRegistry final : public ServedModels {
 public:
  // `base` (already in the serving precision) must outlive the registry; `base_model` serves it
  // alone (adapter "", version 0). `on_staged` is called (from a loader thread) when a version
  // waits in staging. `weight_store` may be null (only the base model is served).
  AdapterRegistry(engine::BaseModel& base, std::shared_ptr<ServedModel> base_model,
                  std::unique_ptr<weight_store::WeightStoreStubs> weight_store,
                  AdapterRegistryOptions options, std::function<void()> on_staged);
  ~AdapterRegistry() override;

  // Starts following an adapter (idempotent). `required`: the replica is not Ready until the
  // version weight-store announces first is servable (a restarted replica never serves stale
  // weights).
  void Follow(const std::string& adapter, bool required = false);
  bool Ready() const;

  // What `selector` (valid by ValidateAdapterSelector) resolves to now: a model; nullptr while
  // it must wait (watch snapshot not in, version not loaded yet); or an error: NOT_FOUND (no
  // committed version for "latest", exact version not in weight-store), FAILED_PRECONDITION (an
  // adapter on a replica without weight-store).
  absl::StatusOr<std::shared_ptr<ServedModel>> TryResolve(
      const type::v1::AdapterSelector& selector) override;
  // The version new requests for `adapter` get; nullptr if none.
  std::shared_ptr<ServedModel> Current(const std::string& adapter) const override;
  std::shared_ptr<ServedModel> base_model() const { return base_; }

  // The swap point: staged versions become servable, the newest becomes current, and versions
  // beyond resident_versions that no sample uses are dropped. Returns how many were swapped in.
  int PromoteStaged() override;

  // GetAdapterStatus: one adapter, or all ("") by name; NOT_FOUND for one never followed.
  absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> Status(const std::string& adapter) const;

 private:
  struct Followed;

  Followed& FollowLocked(const std::string& adapter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool IdleLocked(const Followed& followed, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Unfollows idle adapters and joins the threads of earlier ones that have ended.
  void RetireIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool StoppedLocked(const Followed& followed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Watch(Followed& followed);
  void LoadLoop(Followed& followed);
  // The version the loader should fetch next, or 0.
  int64_t NextLoad(const Followed& followed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Fetches `version` into `fetched` (memory reused from version to version) and builds the
  // model that serves it.
  absl::StatusOr<std::shared_ptr<ServedModel>> Load(const std::string& adapter, int64_t version,
                                                    weight_store::AdapterFetcher& fetcher,
                                                    weight_store::FetchedAdapter& fetched);
  absl::StatusOr<std::shared_ptr<ServedModel>> ResolveExact(Followed& followed, int64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops versions beyond resident_versions that are not current, not in use and not in `keep`.
  void Evict(Followed& followed, const std::vector<int64_t>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  rollout::v1::AdapterStatus StatusOf(const Followed& followed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool SleepUnlessStopped(const Followed& followed, absl::Duration duration);

  engine::BaseModel& base_model_;
  const std::unique_ptr<weight_store::WeightStoreStubs> stub_;
  const AdapterRegistryOptions options_;
  const std::function<void()> on_staged_;
  const std::shared_ptr<ServedModel> base_;
  mutable absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::map<std::string, std::unique_ptr<Followed>> followed_ ABSL_GUARDED_BY(mutex_);
  // Unfollowed, their threads ending.
  std::vector<std::unique_ptr<Followed>> retired_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_
