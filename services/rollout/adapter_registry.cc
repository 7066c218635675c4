#include "services/rollout/adapter_registry.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/status.h"
#include "common/utf8.h"
#include "services/rollout/rollout_metrics.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"

namespace tandem::rollout {
namespace {

// Counts a follower thread out when it ends (declared first, so it runs last), so that a
// retired adapter's threads are joined only once they are done.
class ThreadEndCounter {
 public:
  ThreadEndCounter(absl::Mutex& mutex, int& ended) : mutex_(mutex), ended_(ended) {}
  ~ThreadEndCounter() {
    absl::MutexLock lock(&mutex_);
    ++ended_;
  }

 private:
  absl::Mutex& mutex_;
  int& ended_;
};

// Errors that retrying the same fetch cannot fix.
bool IsPermanent(const absl::Status& status) {
  return absl::IsNotFound(status) || absl::IsInvalidArgument(status) ||
         absl::IsFailedPrecondition(status);
}

}  // namespace

struct AdapterRegistry::Followed {
  std::string name;
  bool required = false;
  bool snapshot_received = false;
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
  grpc::ClientContext* watch_context = nullptr;  // Of the live WatchVersions call.
  absl::Time last_named = absl::Now();           // By a request.
  bool retired = false;                          // Unfollowed: its threads end.
  int threads_ended = 0;
  std::thread watcher, loader;

  int64_t current_version() const { return current == nullptr ? 0 : current->version; }
  int64_t staged_version() const {
    int64_t newest = 0;
    for (const auto& model : staged) newest = std::max(newest, model->version);
    return newest;
  }
};

AdapterRegistry::AdapterRegistry(
    engine::BaseModel& base, std::shared_ptr<ServedModel> base_model,
    std::unique_ptr<weight_store::WeightStoreStubs> weight_store,
    AdapterRegistryOptions options, std::function<void()> on_staged)
    : base_model_(base),
      stub_(std::move(weight_store)),
      options_(std::move(options)),
      on_staged_(std::move(on_staged)),
      base_(std::move(base_model)) {}

AdapterRegistry::~AdapterRegistry() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    for (auto& [name, followed] : followed_) {
      if (followed->watch_context != nullptr) followed->watch_context->TryCancel();
    }
  }
  for (auto& [name, followed] : followed_) {
    followed->watcher.join();
    followed->loader.join();
  }
  for (auto& followed : retired_) {
    followed->watcher.join();
    followed->loader.join();
  }
}

void AdapterRegistry::Follow(const std::string& adapter, bool required) {
  absl::MutexLock lock(&mutex_);
  FollowLocked(adapter).required |= required;
}

AdapterRegistry::Followed& AdapterRegistry::FollowLocked(const std::string& adapter) {
  std::unique_ptr<Followed>& slot = followed_[adapter];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Followed>();
  Followed& followed = *slot;
  followed.name = adapter;
  followed.backoff = options_.initial_backoff;
  followed.watcher = std::thread([this, &followed] { Watch(followed); });
  followed.loader = std::thread([this, &followed] { LoadLoop(followed); });
  return followed;
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

bool AdapterRegistry::StoppedLocked(const Followed& followed) const {
  return stopping_ || followed.retired;
}

bool AdapterRegistry::SleepUnlessStopped(const Followed& followed, absl::Duration duration) {
  absl::MutexLock lock(&mutex_);
  const auto stopped = [&] {
    mutex_.AssertHeld();
    return StoppedLocked(followed);
  };
  mutex_.AwaitWithTimeout(absl::Condition(&stopped), duration);
  return !StoppedLocked(followed);
}

bool AdapterRegistry::IdleLocked(const Followed& followed, absl::Time now) const {
  if (followed.required || now - followed.last_named < options_.unfollow_idle_after ||
      followed.loading_version != 0 || !followed.staged.empty() || !followed.requested.empty()) {
    return false;
  }
  return std::none_of(followed.resident.begin(), followed.resident.end(),
                      [](const auto& entry) { return entry.second->active_samples > 0; });
}

void AdapterRegistry::RetireIdleLocked(absl::Time now) {
  for (auto it = followed_.begin(); it != followed_.end();) {
    Followed& followed = *it->second;
    if (!IdleLocked(followed, now)) {
      ++it;
      continue;
    }
    spdlog::info("unfollowing adapter '{}': no request named it for {}", followed.name,
                 absl::FormatDuration(now - followed.last_named));
    followed.retired = true;
    if (followed.watch_context != nullptr) followed.watch_context->TryCancel();
    auto& versions = RolloutMetrics::Get().adapter_version;
    versions.Remove(&versions.Add({{"adapter", followed.name}}));
    retired_.push_back(std::move(it->second));
    it = followed_.erase(it);
  }
  std::erase_if(retired_, [](const std::unique_ptr<Followed>& followed) {
    if (followed->threads_ended < 2) return false;
    followed->watcher.join();  // Both have counted themselves out: these return at once.
    followed->loader.join();
    return true;
  });
}

void AdapterRegistry::Watch(Followed& followed) {
  ThreadEndCounter end_counter(mutex_, followed.threads_ended);
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mutex_);
      if (StoppedLocked(followed)) return;
      followed.watch_context = &context;
    }
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name(followed.name);
    auto reader = stub_->api().WatchVersions(&context, request);
    weightstore::v1::WatchVersionsResponse response;
    while (reader->Read(&response)) {
      absl::MutexLock lock(&mutex_);
      const int64_t version = response.version().version();
      if (!followed.snapshot_received) followed.first_announced = version;
      followed.snapshot_received = true;
      if (version > followed.newest_announced) {
        followed.newest_announced = version;
        followed.announced_at[version] = absl::Now();
      }
      backoff = options_.initial_backoff;
    }
    const grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&mutex_);
      followed.watch_context = nullptr;
      if (StoppedLocked(followed)) return;
    }
    spdlog::warn("watching adapter '{}' at weight-store ended ({}: {}); retrying in {}",
                 followed.name, static_cast<int>(status.error_code()), status.error_message(),
                 absl::FormatDuration(backoff));
    if (!SleepUnlessStopped(followed, backoff)) return;
    backoff = std::min(2 * backoff, options_.max_backoff);
  }
}

int64_t AdapterRegistry::NextLoad(const Followed& followed) const {
  if (!followed.requested.empty()) return *followed.requested.begin();
  const int64_t have = std::max(followed.current_version(), followed.staged_version());
  return followed.newest_announced > have ? followed.newest_announced : 0;
}

void AdapterRegistry::LoadLoop(Followed& followed) {
  ThreadEndCounter end_counter(mutex_, followed.threads_ended);
  weight_store::AdapterFetcher fetcher(*stub_);
  weight_store::FetchedAdapter fetched;  // Its memory is reused by every version's fetch.
  absl::MutexLock lock(&mutex_);
  while (true) {
    const auto has_work = [&] {
      mutex_.AssertHeld();
      return StoppedLocked(followed) ||
             (NextLoad(followed) != 0 && absl::Now() >= followed.retry_at);
    };
    // Timed, so that a backoff that ends with no new event is noticed.
    while (!mutex_.AwaitWithTimeout(absl::Condition(&has_work), options_.backoff_poll)) {
    }
    if (StoppedLocked(followed)) return;
    const int64_t version = NextLoad(followed);
    const bool requested = followed.requested.contains(version);
    followed.loading_version = version;
    followed.phase = rollout::v1::LOAD_PHASE_FETCHING;
    mutex_.Unlock();
    absl::StatusOr<std::shared_ptr<ServedModel>> loaded =
        Load(followed.name, version, fetcher, fetched);
    mutex_.Lock();
    followed.loading_version = 0;
    if (loaded.ok()) {
      followed.requested.erase(version);  // Staged now; ResolveExact waits for the swap.
      followed.staged.push_back(*std::move(loaded));
      followed.phase = rollout::v1::LOAD_PHASE_STAGED;
      followed.backoff = options_.initial_backoff;
      followed.retry_at = absl::InfinitePast();
      if (on_staged_) on_staged_();
      continue;
    }
    spdlog::warn("loading adapter '{}' version {} failed: {}", followed.name, version,
                 loaded.status().ToString());
    followed.phase =
        followed.staged.empty() ? rollout::v1::LOAD_PHASE_IDLE : rollout::v1::LOAD_PHASE_STAGED;
    followed.last_error = absl::StrCat("version ", version, ": ", loaded.status().ToString());
    followed.last_error_time = absl::Now();
    if (requested && IsPermanent(loaded.status())) {
      followed.requested.erase(version);
      followed.failed_requests[version] = loaded.status();
    } else {
      followed.retry_at = absl::Now() + followed.backoff;
      followed.backoff = std::min(2 * followed.backoff, options_.max_backoff);
    }
  }
}

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterRegistry::Load(
    const std::string& adapter, int64_t version, weight_store::AdapterFetcher& fetcher,
    weight_store::FetchedAdapter& fetched) {
  weightstore::v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name(adapter);
  request.mutable_adapter()->set_exact_version(version);
  weightstore::v1::GetManifestResponse manifest;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.fetch_timeout));
  if (absl::Status status = FromGrpcStatus(stub_->api().GetManifest(&context, request, &manifest));
      !status.ok()) {
    return status;
  }
  if (absl::Status status = fetcher.FetchInto(adapter, version,
                                              {.target = weight_store::EngineTargetLayout(),
                                               .ucx = options_.ucx,
                                               .holder = options_.holder,
                                               .timeout = options_.fetch_timeout},
                                              fetched);
      !status.ok()) {
    return status;
  }
  auto lora =
      weight_store::AdapterFromFetched(base_model_.config(), manifest.manifest().lora(), fetched);
  if (!lora.ok()) return lora.status();
  auto model = std::make_shared<ServedModel>();
  model->adapter = adapter;
  model->version = version;
  model->lora = std::make_unique<engine::LoraAdapter>(
      // LoRA stays bf16 beside FP8 base weights, as inference engines apply it.
      options_.precision == engine::Precision::kF32 ? *std::move(lora) : lora->RoundedToBf16());
  absl::StatusOr<std::unique_ptr<engine::DecodeEngine>> engine =
      options_.make_engine(base_model_, model->lora.get());
  if (!engine.ok()) return engine.status();
  model->engine = *std::move(engine);
  return model;
}

absl::StatusOr<std::shared_ptr<ServedModel>> AdapterRegistry::TryResolve(
    const type::v1::AdapterSelector& selector) {
  if (selector.adapter_name().empty()) return base_;
  if (stub_ == nullptr) {
    return absl::FailedPreconditionError(
        "this replica has no weight-store (--weight_store), so it serves the base model only");
  }
  absl::MutexLock lock(&mutex_);
  // Each followed adapter costs a watch stream and two threads until it is idle: a client
  // naming ever new adapters must not grow that without bound.
  if (!followed_.contains(selector.adapter_name())) RetireIdleLocked(absl::Now());
  if (!followed_.contains(selector.adapter_name()) &&
      static_cast<int>(followed_.size()) >= options_.max_followed_adapters) {
    return absl::ResourceExhaustedError(absl::StrCat("this replica already follows ",
                                                     followed_.size(),
                                                     " adapters (--max_followed_adapters); "
                                                     "cannot also serve '",
                                                     selector.adapter_name(), "'"));
  }
  Followed& followed = FollowLocked(selector.adapter_name());
  followed.last_named = absl::Now();
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
  absl::MutexLock lock(&mutex_);
  int swapped = 0;
  const absl::Time now = absl::Now();
  RetireIdleLocked(now);
  for (auto& [name, followed] : followed_) {
    if (followed->staged.empty()) continue;
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
