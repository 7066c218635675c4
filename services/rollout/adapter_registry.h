#ifndef TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_
#define TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/call_tracker.h"
#include "common/clock.h"
#include "engine/decode_engine.h"
#include "engine/model.h"
#include "services/rollout/adapter_loader.h"
#include "services/rollout/sequence_batch.h"
#include "services/rollout/served_model.h"
#include "services/rollout/status_listeners.h"
#include "services/rollout/version_watch.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/rollout/v1/rollout.pb.h"

namespace tandem::rollout {

struct AdapterRegistryOptions {
  // Versions of one adapter kept servable; older ones go once no sample uses them. The newest
  // version is always made servable, so the count is exceeded while all others are in use.
  int resident_versions = 3;
  // Adapters a replica follows at most, those it is still asking weight-store about included
  // (each holds a watch stream, no thread); a request naming one more is RESOURCE_EXHAUSTED.
  int max_followed_adapters = 64;
  // A followed adapter that no request has named for this long, with nothing loading, staged or
  // in use, is unfollowed: its watch stream, versions and metric series are released, so a
  // replica serving one job after another never runs into max_followed_adapters. Adapters the
  // replica was started with (Follow(..., required)) are kept.
  absl::Duration unfollow_idle_after = absl::Minutes(10);
  // Threads that fetch and build adapter versions (and reopen ended watch streams), shared by
  // all followed adapters: a replica's threads do not grow with the adapters it follows.
  int loader_threads = 2;
  AdapterLoaderOptions loader;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // How often an idle loader thread looks whether a retry backoff has ended.
  absl::Duration backoff_poll = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(10);
  // What idle unfollowing, backoffs and the status's times read; not owned.
  Clock* clock = &Clock::Real();
};

// The adapter versions a rollout replica serves, in TF Serving's split: per followed adapter a
// VersionWatch (the source) hears weight-store's commits; a small pool of loader threads
// (AdapterLoader) fetches new versions in the background into staging, retrying failures with
// backoff while the old version keeps serving; this class (the manager) keeps the resident
// versions, and makes staged ones servable only in PromoteStaged, which the scheduler calls
// between decode steps, so a decode step never sees a half-loaded adapter. An adapter is
// followed only while weight-store knows it (a committed version, or an upload open): a request
// naming any other gets NOT_FOUND and leaves nothing behind. Thread-safe.
class AdapterRegistry final : public ServedModels {
 public:
  // `base` (already in the serving precision) must outlive the registry; `base_model` serves it
  // alone (adapter "", version 0). `on_staged` is called (from a loader thread) when a version
  // waits in staging, never after StopLoading. `weight_store` may be null (only the base model is
  // served).
  AdapterRegistry(engine::BaseModel& base, std::shared_ptr<ServedModel> base_model,
                  std::unique_ptr<weight_store::WeightStoreStubs> weight_store,
                  AdapterRegistryOptions options, std::function<void()> on_staged);
  ~AdapterRegistry() override;  // StopLoading, if not done before.

  // Ends the watch streams and stops the loader threads: nothing is loaded or staged any more,
  // and on_staged is not called again. Idempotent; resolved models stay servable.
  void StopLoading();

  // Starts following an adapter (idempotent). `required`: the replica is not Ready until the
  // version weight-store announces first is servable (a restarted replica never serves stale
  // weights), and follows it even before weight-store knows it.
  void Follow(const std::string& adapter, bool required = false);
  bool Ready() const;

  // What `selector` (valid by ValidateAdapterSelector) resolves to now: a model; nullptr while
  // it must wait (watch snapshot not in, version not loaded yet); or an error: NOT_FOUND (an
  // adapter weight-store does not know, no committed version for "latest", exact version not in
  // weight-store), RESOURCE_EXHAUSTED (max_followed_adapters), FAILED_PRECONDITION (an adapter
  // on a replica without weight-store).
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
  // Told after every change of an adapter's Status, outside the registry's lock.
  StatusListeners& status_listeners() const { return status_listeners_; }

 private:
  struct Followed;
  // What a loader thread does next, taken under the lock and done outside it.
  struct LoaderWork {
    std::vector<std::shared_ptr<VersionWatch>> cancel;
    std::vector<std::string> release;  // Leases of announcements it will not load.
    std::shared_ptr<Followed> watch;   // Open its watch stream.
    std::shared_ptr<Followed> load;    // Load load_version of it (kept alive meanwhile).
    int64_t load_version = 0;
    std::optional<VersionWatch::Announcement> announced;  // With its lease and plan, if pushed.
  };

  Followed& FollowLocked(const std::string& adapter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // PromoteStaged but for telling listeners: names the adapters whose status changed (swapped
  // in, or unfollowed).
  int SwapInStaged(std::vector<std::string>& changed) ABSL_LOCKS_EXCLUDED(mutex_);
  bool IdleLocked(const Followed& followed, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Unfollows idle adapters and those weight-store does not know.
  void RetireIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RetireLocked(std::map<std::string, std::shared_ptr<Followed>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The loader threads' loop, and its steps.
  void RunLoader();
  bool HasWorkLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  LoaderWork TakeWorkLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void StartWatch(const std::shared_ptr<Followed>& followed);
  void OnWatchEvent(Followed& followed, const VersionWatch::Announcement& announced);
  void OnWatchEnd(Followed& followed, const VersionWatch* watch, const grpc::Status& status);
  void LoadVersion(Followed& followed, int64_t version,
                   const std::optional<VersionWatch::Announcement>& announced,
                   weight_store::AdapterFetcher& fetcher, weight_store::FetchedAdapter& fetched);
  absl::StatusOr<std::shared_ptr<ServedModel>> ResolveExact(Followed& followed, int64_t version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops versions beyond resident_versions that are not current, not in use and not in `keep`.
  void Evict(Followed& followed, const std::vector<int64_t>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  rollout::v1::AdapterStatus StatusOf(const Followed& followed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::unique_ptr<weight_store::WeightStoreStubs> stub_;
  const AdapterRegistryOptions options_;
  const std::function<void()> on_staged_;
  const std::shared_ptr<ServedModel> base_;
  const std::optional<AdapterLoader> loader_;  // With a weight-store.
  CallTracker watch_calls_;                    // Open VersionWatch streams.
  mutable StatusListeners status_listeners_;
  mutable absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::map<std::string, std::shared_ptr<Followed>> followed_ ABSL_GUARDED_BY(mutex_);
  // Adapters unfollowed whose status listeners have not been told yet (PromoteStaged tells them).
  std::vector<std::string> retired_untold_ ABSL_GUARDED_BY(mutex_);
  // Streams of unfollowed adapters, cancelled by a loader thread outside the lock.
  std::vector<std::shared_ptr<VersionWatch>> to_cancel_ ABSL_GUARDED_BY(mutex_);
  // Leases of announcements that will not be loaded, released by a loader thread.
  std::vector<std::string> to_release_ ABSL_GUARDED_BY(mutex_);
  // The store answered WatchReadPlans UNIMPLEMENTED (it is older): watch versions only.
  bool plans_unsupported_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ADAPTER_REGISTRY_H_
