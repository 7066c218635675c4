#include "services/rollout/adapter_registry.h"

#include <algorithm>
#include <set>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/utf8.h"
#include "services/rollout/rollout_metrics.h"

namespace tandem::rollout {
namespace {

// Errors that retrying the same fetch cannot fix.
bool IsPermanent(const absl::Status& status) {
  return absl::IsNotFound(status) || absl::IsInvalidArgument(status) ||
         absl::IsFailedPrecondition(status);
}

// How long an adapter weight-store does not know stays, for the requests naming it to be
// answered NOT_FOUND (they ask every few milliseconds).
constexpr absl::Duration kUnknownKept = absl::Seconds(1);

}  // namespace

struct AdapterRegistry::Followed {
  std::string name;
  bool required = false;
  bool snapshot_received = false;
  // Its first snapshot said weight-store does not know it (no version, no upload open).
  bool unknown = false;
  int64_t first_announced = 0;  // The first snapshot's version: what Ready() waits for.
  int64_t newest_announced = 0;
  std::map<int64_t, absl::Time> announced_at;
  absl::btree_map<int64_t, std::shared_ptr<ServedModel>> resident;
  std::shared_ptr<ServedModel> current;
  std::vector<std::shared_ptr<ServedModel>> staged;
  std::set<int64_t> requested;  // Exact versions asked for, not servable yet.
  absl::flat_hash_map<int64_t, absl::Status> failed_requests;
  int64_t loading_version = 0;
  rollout::v1::LoadPhase phase = rollout::v1::LOAD_PHASE_IDLE;
  std::string last_error;
  absl::Time last_error_time = absl::InfinitePast();
  absl::Time last_swap_time = absl::InfinitePast();
  absl::Time retry_at = absl::InfinitePast();
  absl::Duration backoff;
  // The newest version announced with a lease and a read plan (WatchReadPlans) and not yet
  // loaded: its load fetches with them. An older one's lease is given back when a newer comes.
  std::map<int64_t, VersionWatch::Announcement> planned;
  std::shared_ptr<VersionWatch> watch;           // The open stream; null between streams.
  absl::Time rewatch_at = absl::InfinitePast();  // When a loader thread (re)opens it.
  absl::Duration watch_backoff;
  absl::Time last_named;  // By a request (or when followed).
  bool retired = false;   // Unfollowed.

  int64_t current_version() const { return current == nullptr ? 0 : current->version; }
  int64_t staged_version() const {
    int64_t newest = 0;
    for (const auto& model : staged) newest = std::max(newest, model->version);
    return newest;
  }
  // The version a loader should fetch next, or 0.
  int64_t next_load() const {
    if (!snapshot_received || unknown) return 0;
    if (!requested.empty()) return *requested.begin();
    const int64_t have = std::max(current_version(), staged_version());
    return newest_announced > have ? newest_announced : 0;
  }
  // What a loader thread should do for it at `now`: (re)open its stream; load a version (0: no).
  bool watch_due(absl::Time now) const { return watch == nullptr && !unknown && now >= rewatch_at; }
  int64_t load_due(absl::Time now) const {
    return loading_version == 0 && now >= retry_at ? next_load() : 0;
  }
};

AdapterRegistry::AdapterRegistry(engine::BaseModel& base, std::shared_ptr<ServedModel> base_model,
                                 std::unique_ptr<weight_store::WeightStoreStubs> weight_store,
                                 AdapterRegistryOptions options, std::function<void()> on_staged)
    : stub_(std::move(weight_store)),
      options_(std::move(options)),
      on_staged_(std::move(on_staged)),
      base_(std::move(base_model)),
      loader_(stub_ == nullptr ? std::nullopt
                               : std::make_optional<AdapterLoader>(base, *stub_, options_.loader)) {
  if (stub_ == nullptr) return;
  for (int i = 0; i < std::max(1, options_.loader_threads); ++i) {
    threads_.emplace_back([this] { RunLoader(); });
  }
}

AdapterRegistry::~AdapterRegistry() { StopLoading(); }

void AdapterRegistry::StopLoading() {
  std::vector<std::shared_ptr<VersionWatch>> open;
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    open = std::move(to_cancel_);
    for (auto& [name, followed] : followed_) {
      if (followed->watch != nullptr) open.push_back(followed->watch);
    }
  }
  for (const auto& watch : open) watch->Cancel();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  // Their callbacks hold this registry: every stream must have ended.
  if (!watch_calls_.WaitUntilIdle(absl::Seconds(30))) {
    spdlog::error("adapter watch streams still open 30 s after being cancelled");
  }
}

void AdapterRegistry::Follow(const std::string& adapter, bool required) {
  absl::MutexLock lock(&mutex_);
  FollowLocked(adapter).required |= required;
}

AdapterRegistry::Followed& AdapterRegistry::FollowLocked(const std::string& adapter) {
  std::shared_ptr<Followed>& slot = followed_[adapter];
  if (slot == nullptr) {
    slot = std::make_shared<Followed>();
    slot->name = adapter;
    slot->last_named = options_.clock->Now();
    slot->backoff = options_.initial_backoff;
    slot->watch_backoff = options_.initial_backoff;
  }
  return *slot;
}

bool AdapterRegistry::Ready() const {
  absl::MutexLock lock(&mutex_);
  for (const auto& [name, followed] : followed_) {
    if (!followed->required) continue;
    if (!followed->snapshot_received) return false;
    if (followed->current_version() < followed->first_announced) return false;
  }
  return true;
}

bool AdapterRegistry::IdleLocked(const Followed& followed, absl::Time now) const {
  if (followed.required) return false;
  // Kept until a request waiting on its snapshot hears NOT_FOUND, or its client has gone.
  if (followed.unknown) return now - followed.last_named > kUnknownKept;
  if (now - followed.last_named < options_.unfollow_idle_after || followed.loading_version != 0 ||
      !followed.staged.empty() || !followed.requested.empty()) {
    return false;
  }
  return std::none_of(followed.resident.begin(), followed.resident.end(),
                      [](const auto& entry) { return entry.second->active_samples > 0; });
}

void AdapterRegistry::RetireIdleLocked(absl::Time now) {
  for (auto it = followed_.begin(); it != followed_.end();) {
    if (!IdleLocked(*it->second, now)) {
      ++it;
      continue;
    }
    if (!it->second->unknown) {
      spdlog::info("unfollowing adapter '{}': no request named it for {}", it->first,
                   absl::FormatDuration(now - it->second->last_named));
    }
    RetireLocked(it++);
  }
}

void AdapterRegistry::RetireLocked(std::map<std::string, std::shared_ptr<Followed>>::iterator it) {
  Followed& followed = *it->second;
  followed.retired = true;
  if (followed.watch != nullptr) to_cancel_.push_back(std::move(followed.watch));
  for (const auto& [version, plan] : followed.planned) to_release_.push_back(plan.lease_id());
  followed.planned.clear();
  if (followed.current != nullptr) {
    auto& versions = RolloutMetrics::Get().adapter_version;
    versions.Remove(&versions.Add({{"adapter", followed.name}}));
  }
  retired_untold_.push_back(followed.name);
  followed_.erase(it);  // A loader or stream callback still holding it finds it retired.
}

void AdapterRegistry::RunLoader() {
  weight_store::AdapterFetcher fetcher(*stub_);
  weight_store::FetchedAdapter fetched;  // Its memory is reused by every version's fetch.
  while (true) {
    LoaderWork work;
    {
      absl::MutexLock lock(&mutex_);
      const auto has_work = [&] {
        mutex_.AssertHeld();
        return stopping_ || HasWorkLocked(options_.clock->Now());
      };
      // Timed, so that a backoff that ends with no new event is noticed.
      while (!mutex_.AwaitWithTimeout(absl::Condition(&has_work), options_.backoff_poll)) {
      }
      if (stopping_) return;
      work = TakeWorkLocked(options_.clock->Now());
    }
    for (const auto& watch : work.cancel) watch->Cancel();
    for (const std::string& lease_id : work.release) weight_store::ReleaseLease(*stub_, lease_id);
    if (work.watch != nullptr) StartWatch(work.watch);
    if (work.load != nullptr) {
      status_listeners_.Notify(work.load->name);  // Fetching.
      LoadVersion(*work.load, work.load_version, work.announced, fetcher, fetched);
      status_listeners_.Notify(work.load->name);  // Staged, or failed.
    }
  }
}

bool AdapterRegistry::HasWorkLocked(absl::Time now) const {
  if (!to_cancel_.empty() || !to_release_.empty()) return true;
  return std::any_of(followed_.begin(), followed_.end(), [&](const auto& entry) {
    return entry.second->watch_due(now) || entry.second->load_due(now) != 0;
  });
}

AdapterRegistry::LoaderWork AdapterRegistry::TakeWorkLocked(absl::Time now) {
  LoaderWork work;
  work.cancel = std::move(to_cancel_);
  to_cancel_.clear();
  work.release = std::move(to_release_);
  to_release_.clear();
  for (auto& [name, followed] : followed_) {
    if (followed->watch_due(now)) {
      // Recorded before it starts, so that its callbacks find it.
      followed->watch = VersionWatch::Create();
      work.watch = followed;
      return work;
    }
  }
  for (auto& [name, followed] : followed_) {
    if (const int64_t version = followed->load_due(now); version != 0) {
      followed->loading_version = version;
      followed->phase = rollout::v1::LOAD_PHASE_FETCHING;
      work.load = followed;
      work.load_version = version;
      if (auto plan = followed->planned.extract(version); !plan.empty()) {
        work.announced = std::move(plan.mapped());
      }
      return work;
    }
  }
  return work;
}

void AdapterRegistry::StartWatch(const std::shared_ptr<Followed>& followed) {
  std::shared_ptr<VersionWatch> watch;
  bool plans_unsupported;
  {
    absl::MutexLock lock(&mutex_);
    watch = followed->watch;
    plans_unsupported = plans_unsupported_;
  }
  if (watch == nullptr) return;  // Retired meanwhile: its stream is cancelled, never opened.
  Followed* raw = followed.get();
  watch->Start(
      *stub_, followed->name,
      plans_unsupported || !loader_.has_value() ? std::nullopt : loader_->PlansRequest(),
      [this, raw](const VersionWatch::Announcement& event) {
        OnWatchEvent(*raw, event);
        status_listeners_.Notify(raw->name);
      },
      // The callbacks own the adapter's state until the stream has ended.
      [this, followed, raw = watch.get()](const grpc::Status& status) {
        OnWatchEnd(*followed, raw, status);
      },
      watch_calls_);
}

void AdapterRegistry::OnWatchEvent(Followed& followed,
                                   const VersionWatch::Announcement& announced) {
  absl::MutexLock lock(&mutex_);
  const weightstore::v1::WatchVersionsResponse& event = announced.announcement();
  const int64_t version = event.version().version();
  if (!announced.lease_id().empty()) {
    const int64_t have =
        std::max({followed.current_version(), followed.staged_version(), followed.loading_version});
    if (stopping_ || followed.retired || version <= have) {
      // Never to be loaded from this announcement. At a stop its lease expires at its TTL.
      to_release_.push_back(announced.lease_id());
    } else {
      for (const auto& [older, plan] : followed.planned) to_release_.push_back(plan.lease_id());
      followed.planned.clear();
      followed.planned[version] = announced;
    }
  }
  if (!followed.snapshot_received) {
    followed.snapshot_received = true;
    followed.first_announced = version;
    // A name weight-store does not know is not followed: the request naming it is answered
    // NOT_FOUND, and nothing of it stays.
    if (version == 0 && !event.upload_open() && !followed.required) {
      followed.unknown = true;
      if (followed.watch != nullptr) to_cancel_.push_back(followed.watch);
      return;
    }
  }
  if (version > followed.newest_announced) {
    followed.newest_announced = version;
    followed.announced_at[version] = options_.clock->Now();
  }
  followed.watch_backoff = options_.initial_backoff;
}

void AdapterRegistry::OnWatchEnd(Followed& followed, const VersionWatch* watch,
                                 const grpc::Status& status) {
  absl::MutexLock lock(&mutex_);
  if (followed.watch.get() == watch) followed.watch = nullptr;
  if (stopping_ || followed.retired || followed.unknown) return;
  const grpc::StatusCode code = status.error_code();
  const bool plans_refused = code == grpc::StatusCode::UNIMPLEMENTED ||
                             code == grpc::StatusCode::FAILED_PRECONDITION ||
                             code == grpc::StatusCode::INVALID_ARGUMENT;
  if (plans_refused && !plans_unsupported_ && loader_->PlansRequest().has_value()) {
    // A store older than WatchReadPlans, or one without UCX: watch with WatchVersions from now
    // on, at once.
    spdlog::info("weight-store does not push read plans ({}); watching versions only",
                 status.error_message());
    plans_unsupported_ = true;
    followed.rewatch_at = options_.clock->Now();
    return;
  }
  spdlog::warn("watching adapter '{}' at weight-store ended ({}: {}); retrying in {}",
               followed.name, static_cast<int>(status.error_code()), status.error_message(),
               absl::FormatDuration(followed.watch_backoff));
  followed.rewatch_at = options_.clock->Now() + followed.watch_backoff;
  followed.watch_backoff = std::min(2 * followed.watch_backoff, options_.max_backoff);
}

void AdapterRegistry::LoadVersion(Followed& followed, int64_t version,
                                  const std::optional<VersionWatch::Announcement>& announced,
                                  weight_store::AdapterFetcher& fetcher,
                                  weight_store::FetchedAdapter& fetched) {
  absl::StatusOr<std::shared_ptr<ServedModel>> loaded = loader_->Load(
      followed.name, version, announced.has_value() ? &*announced : nullptr, fetcher, fetched);
  absl::MutexLock lock(&mutex_);
  const bool requested = followed.requested.contains(version);
  followed.loading_version = 0;
  if (loaded.ok()) {
    // Announcements of this version or older (an exact request's path) will not be loaded.
    for (auto it = followed.planned.begin();
         it != followed.planned.end() && it->first <= version;) {
      to_release_.push_back(it->second.lease_id());
      it = followed.planned.erase(it);
    }
    followed.requested.erase(version);  // Staged now; ResolveExact waits for the swap.
    followed.staged.push_back(*std::move(loaded));
    followed.phase = rollout::v1::LOAD_PHASE_STAGED;
    followed.backoff = options_.initial_backoff;
    followed.retry_at = absl::InfinitePast();
    if (on_staged_) on_staged_();
    return;
  }
  spdlog::warn("loading adapter '{}' version {} failed: {}", followed.name, version,
               loaded.status().ToString());
  followed.phase =
      followed.staged.empty() ? rollout::v1::LOAD_PHASE_IDLE : rollout::v1::LOAD_PHASE_STAGED;
  followed.last_error =
      absl::StrCat("version ", version, ": ",
                   loaded.status().ToString(absl::StatusToStringMode::kWithNoExtraData));
  followed.last_error_time = options_.clock->Now();
  if (requested && IsPermanent(loaded.status())) {
    followed.requested.erase(version);
    followed.failed_requests[version] = loaded.status();
  } else {
    followed.retry_at = options_.clock->Now() + followed.backoff;
    followed.backoff = std::min(2 * followed.backoff, options_.max_backoff);
  }
}

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterRegistry::TryResolve(
    const type::v1::AdapterSelector& selector) {
  if (selector.adapter_name().empty()) return base_;
  if (stub_ == nullptr) {
    return absl::FailedPreconditionError(
        "this replica has no weight-store (--weight_store), so it serves the base model only");
  }
  absl::MutexLock lock(&mutex_);
  // Each followed adapter costs a watch stream and its versions until it is idle: a client
  // naming ever new adapters must not grow that without bound.
  if (!followed_.contains(selector.adapter_name())) RetireIdleLocked(options_.clock->Now());
  if (auto found = followed_.find(selector.adapter_name());
      found != followed_.end() && found->second->unknown) {
    RetireLocked(found);
    return absl::NotFoundError(absl::StrCat("adapter '", selector.adapter_name(),
                                            "' has no committed version in weight-store and no "
                                            "upload open"));
  }
  if (!followed_.contains(selector.adapter_name()) &&
      static_cast<int>(followed_.size()) >= options_.max_followed_adapters) {
    // A slot held by a name weight-store has not answered for yet is free again in moments
    // (most likely: a burst of names it does not know), so the request waits for it.
    const bool probing = std::any_of(followed_.begin(), followed_.end(), [](const auto& entry) {
      return !entry.second->required && (!entry.second->snapshot_received || entry.second->unknown);
    });
    if (probing) return nullptr;
    return absl::ResourceExhaustedError(absl::StrCat("this replica already follows ",
                                                     followed_.size(),
                                                     " adapters (--max_followed_adapters); "
                                                     "cannot also serve '",
                                                     selector.adapter_name(), "'"));
  }
  Followed& followed = FollowLocked(selector.adapter_name());
  followed.last_named = options_.clock->Now();
  switch (selector.version_case()) {
    case type::v1::AdapterSelector::kExactVersion:
      return ResolveExact(followed, selector.exact_version());
    case type::v1::AdapterSelector::kMinVersion:
      if (followed.current_version() >= selector.min_version()) return followed.current;
      return nullptr;
    default:  // latest
      if (!followed.snapshot_received) return nullptr;
      if (followed.newest_announced == 0) {
        return absl::NotFoundError(
            absl::StrCat("adapter '", followed.name, "' has no committed version in weight-store"));
      }
      if (followed.current_version() >= followed.newest_announced) return followed.current;
      return nullptr;
  }
}

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterRegistry::ResolveExact(Followed& followed,
                                                                           int64_t version) {
  if (auto found = followed.resident.find(version); found != followed.resident.end()) {
    return found->second;
  }
  if (auto failed = followed.failed_requests.find(version);
      failed != followed.failed_requests.end()) {
    absl::Status status = failed->second;
    followed.failed_requests.erase(failed);
    return status;
  }
  const bool loading = followed.loading_version == version ||
                       std::any_of(followed.staged.begin(), followed.staged.end(),
                                   [&](const auto& model) { return model->version == version; });
  if (!loading) followed.requested.insert(version);
  return nullptr;
}

std::shared_ptr<ServedModel> AdapterRegistry::Current(const std::string& adapter) const {
  absl::MutexLock lock(&mutex_);
  auto found = followed_.find(adapter);
  return found == followed_.end() ? nullptr : found->second->current;
}

int AdapterRegistry::PromoteStaged() {
  std::vector<std::string> changed;
  const int swapped = SwapInStaged(changed);
  for (const std::string& adapter : changed) status_listeners_.Notify(adapter);
  return swapped;
}

int AdapterRegistry::SwapInStaged(std::vector<std::string>& changed) {
  absl::MutexLock lock(&mutex_);
  int swapped = 0;
  const absl::Time now = options_.clock->Now();
  RetireIdleLocked(now);
  for (auto& [name, followed] : followed_) {
    if (followed->staged.empty()) continue;
    changed.push_back(name);
    followed->phase = rollout::v1::LOAD_PHASE_SWAPPING;
    std::vector<int64_t> promoted;
    for (std::shared_ptr<ServedModel>& model : followed->staged) {
      promoted.push_back(model->version);
      model->ready_time = now;
      followed->requested.erase(model->version);
      if (model->version > followed->current_version()) {
        followed->current = model;
        RolloutMetrics::Get().adapter_version.Add({{"adapter", name}}).Set(model->version);
        if (auto announced = followed->announced_at.find(model->version);
            announced != followed->announced_at.end()) {
          RolloutMetrics::Get().adapter_swap_seconds.Observe(
              absl::ToDoubleSeconds(now - announced->second));
        }
      }
      followed->resident[model->version] = std::move(model);
      ++swapped;
    }
    followed->staged.clear();
    followed->last_swap_time = now;
    // The loader may be fetching the next version meanwhile.
    followed->phase = followed->loading_version != 0 ? rollout::v1::LOAD_PHASE_FETCHING
                                                     : rollout::v1::LOAD_PHASE_IDLE;
    // A version just loaded for an exact request stays until that request had its chance.
    Evict(*followed, promoted);
  }
  // Unfollowed since the last step (here or in TryResolve): their watchers hear it now.
  changed.insert(changed.end(), retired_untold_.begin(), retired_untold_.end());
  retired_untold_.clear();
  return swapped;
}

void AdapterRegistry::Evict(Followed& followed, const std::vector<int64_t>& keep) {
  for (auto it = followed.resident.begin();
       it != followed.resident.end() &&
       static_cast<int>(followed.resident.size()) > options_.resident_versions;) {
    const bool in_use = it->second == followed.current || it->second->active_samples > 0 ||
                        std::find(keep.begin(), keep.end(), it->first) != keep.end();
    it = in_use ? std::next(it) : followed.resident.erase(it);
  }
  std::erase_if(followed.announced_at,
                [&](const auto& entry) { return entry.first <= followed.current_version(); });
}

rollout::v1::AdapterStatus AdapterRegistry::StatusOf(const Followed& followed) const {
  rollout::v1::AdapterStatus status;
  status.set_adapter_name(followed.name);
  status.set_current_version(followed.current_version());
  for (const auto& [version, model] : followed.resident) {
    rollout::v1::ResidentVersion& resident = *status.add_resident_versions();
    resident.set_version(version);
    resident.set_active_samples(model->active_samples);
    *resident.mutable_ready_time() = ToTimestamp(model->ready_time);
  }
  status.set_loading_version(followed.loading_version != 0 ? followed.loading_version
                                                           : followed.staged_version());
  status.set_load_phase(followed.phase);
  status.set_newest_announced_version(followed.newest_announced);
  status.set_last_error(ValidUtf8(followed.last_error));
  if (followed.last_error_time != absl::InfinitePast()) {
    *status.mutable_last_error_time() = ToTimestamp(followed.last_error_time);
  }
  if (followed.last_swap_time != absl::InfinitePast()) {
    *status.mutable_last_swap_time() = ToTimestamp(followed.last_swap_time);
  }
  return status;
}

absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> AdapterRegistry::Status(
    const std::string& adapter) const {
  if (!adapter.empty()) {
    if (absl::Status status = ValidateIdentifier("adapter_name", adapter); !status.ok()) {
      return status;
    }
  }
  absl::MutexLock lock(&mutex_);
  std::vector<rollout::v1::AdapterStatus> statuses;
  if (!adapter.empty()) {
    auto found = followed_.find(adapter);
    if (found == followed_.end()) {
      return absl::NotFoundError(absl::StrCat("this replica does not serve adapter '", adapter,
                                              "' (no request or --adapter named it)"));
    }
    statuses.push_back(StatusOf(*found->second));
    return statuses;
  }
  for (const auto& [name, followed] : followed_) statuses.push_back(StatusOf(*followed));
  return statuses;
}

}  // namespace tandem::rollout
