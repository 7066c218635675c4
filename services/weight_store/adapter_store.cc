#include "services/weight_store/adapter_store.h"

#include <unistd.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/parallel_tasks.h"
#include "common/proto_time.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/reshard.h"

namespace tandem::weight_store {

namespace {

// 0 where the system does not say.
uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<uint64_t>(pages) * page_bytes : 0;
}

std::string RandomId(absl::string_view prefix) {
  thread_local absl::BitGen random;
  return absl::StrFormat("%s-%016x%016x", prefix, absl::Uniform<uint64_t>(random),
                         absl::Uniform<uint64_t>(random));
}

std::string VersionName(absl::string_view adapter, int64_t version) {
  return absl::StrCat(adapter, "@", version);
}

uint64_t TotalBytes(const weightstore::v1::Manifest& manifest) {
  uint64_t total = 0;
  for (const weightstore::v1::Shard& shard : manifest.shards()) total += shard.byte_size();
  return total;
}

// Whether two manifests describe the same version, commit times aside.
bool SameContent(weightstore::v1::Manifest a, weightstore::v1::Manifest b) {
  a.clear_commit_time();
  b.clear_commit_time();
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AdapterStore>> AdapterStore::Open(
    const AdapterStoreOptions& options) {
  // The newest version is always kept: versions only grow, so a retired number is never
  // published again, and its files can be retired after the lock is released.
  if (options.keep_versions < 1) {
    return InvalidRequest("INVALID_OPTION", absl::StrCat("keep_versions is ", options.keep_versions,
                                                         "; must be >= 1"));
  }
  std::unique_ptr<AdapterStore> store(new AdapterStore(options));
  if (absl::Status status = store->Recover(); !status.ok()) return status;
  return store;
}

AdapterStore::~AdapterStore() = default;

std::shared_ptr<const CommittedVersion> AdapterStore::Share(CommittedVersion version) const {
  return std::shared_ptr<const CommittedVersion>(new CommittedVersion(std::move(version)),
                                                 [pool = pool_](CommittedVersion* retired) {
                                                   for (auto& shard : retired->shards)
                                                     pool->Give(std::move(shard));
                                                   delete retired;
                                                 });
}

absl::Status AdapterStore::Recover() {
  absl::StatusOr<StoredVersions> stored = ReadVersions(options_.data_dir, options_.ucx);
  if (!stored.ok()) return stored.status();
  for (const std::string& reason : stored->skipped) {
    spdlog::error("weight-store: not recovering a stored version: {}", reason);
  }
  for (const weightstore::v1::Manifest& manifest : stored->unwritten) {
    spdlog::warn(
        "weight-store: {} was announced but lost before it was durable; it can be "
        "published again only with the manifest it was announced with",
        VersionName(manifest.adapter_name(), manifest.version()));
  }
  std::vector<RetiredVersion> retired;
  {
    absl::MutexLock lock(&mutex_);
    for (std::unique_ptr<CommittedVersion>& version : stored->committed) {
      const std::string adapter = version->manifest.adapter_name();
      const int64_t number = version->manifest.version();
      adapters_[adapter].versions[number] = Share(std::move(*version));
    }
    for (weightstore::v1::Manifest& manifest : stored->unwritten) {
      const int64_t number = manifest.version();
      adapters_[manifest.adapter_name()].unwritten[number] = std::move(manifest);
    }
    for (const auto& [adapter, unused] : adapters_)
      RetainLocked(adapter, options_.clock->Now(), retired);
  }
  RetireFiles(retired);
  if (!stored->committed.empty()) {
    spdlog::info("weight-store: recovered {} committed versions from {}", stored->committed.size(),
                 options_.data_dir);
  }
  return absl::OkStatus();
}

absl::StatusOr<BeginResult> AdapterStore::Begin(const weightstore::v1::Manifest& manifest,
                                                bool use_ucx) {
  if (absl::Status status = ValidateManifest(manifest); !status.ok()) return status;
  const std::string name = VersionName(manifest.adapter_name(), manifest.version());
  if (absl::Status status = CheckStackable(manifest); !status.ok()) {
    return Annotate(status, absl::StrCat(name, ": "));
  }
  if (use_ucx && options_.ucx == nullptr) {
    return absl::FailedPreconditionError("this weight-store runs without UCX; publish over gRPC");
  }
  // Shards may be up to 2^40 bytes each: an upload this host could never hold is refused up
  // front rather than left to the allocator (or the OOM killer, once the bytes arrive).
  const uint64_t total_bytes = TotalBytes(manifest);
  if (const uint64_t memory = PhysicalMemoryBytes(); memory > 0 && total_bytes > memory) {
    return absl::ResourceExhaustedError(absl::StrCat(name, " has ", total_bytes,
                                                     " bytes of shards; this host has ", memory,
                                                     " bytes of memory"));
  }
  weightstore::v1::Manifest normalized = manifest;  // As stored, so a retried Begin compares equal.
  normalized.set_total_bytes(total_bytes);
  normalized.clear_commit_time();
  absl::MutexLock lock(&mutex_);
  if (auto it = adapters_.find(manifest.adapter_name()); it != adapters_.end()) {
    const Adapter& adapter = it->second;
    // A version still being written has its upload committing: the loop below answers.
    if (adapter.versions.contains(manifest.version()) &&
        !adapter.writing.contains(manifest.version())) {
      return absl::AlreadyExistsError(absl::StrCat(name, " is already committed"));
    }
    // Versions only increase for watchers: also past one announced and then lost.
    if (manifest.version() < adapter.NewestAnnounced()) {
      return absl::FailedPreconditionError(absl::StrCat("version ", manifest.version(),
                                                        " < newest ", adapter.NewestAnnounced(),
                                                        " of ", manifest.adapter_name()));
    }
    if (auto lost = adapter.unwritten.find(manifest.version());
        lost != adapter.unwritten.end() && !SameContent(lost->second, normalized)) {
      return absl::FailedPreconditionError(absl::StrCat(
          name,
          " was announced with another manifest, then lost before it was durable: it can "
          "be published again only as announced; publish a newer version"));
    }
  }
  for (auto& [id, upload] : uploads_) {
    if (upload->state == Upload::State::kAborted || Expired(*upload, options_.clock->Now()) ||
        upload->manifest.adapter_name() != manifest.adapter_name() ||
        upload->manifest.version() != manifest.version()) {
      continue;
    }
    if (upload->state == Upload::State::kOpen && upload->use_ucx == use_ucx &&
        google::protobuf::util::MessageDifferencer::Equals(upload->manifest, normalized)) {
      upload->expire_time = options_.clock->Now() + options_.upload_expiry;  // A retried Begin.
      BeginResult result{.upload_id = id, .expire_time = upload->expire_time};
      for (const auto& shard : upload->shards) result.shards.push_back(shard.get());
      return result;
    }
    return absl::AbortedError(absl::StrCat("upload ", id, " for ", name, " in progress"));
  }
  auto upload = std::make_unique<Upload>();
  upload->id = RandomId("upload");
  upload->manifest = std::move(normalized);
  upload->use_ucx = use_ucx;
  upload->begun = options_.clock->Now();
  upload->expire_time = upload->begun + options_.upload_expiry;
  for (const weightstore::v1::Shard& shard : manifest.shards()) {
    absl::StatusOr<std::unique_ptr<ShardBuffer>> buffer = pool_->Take(shard.byte_size());
    if (!buffer.ok()) return buffer.status();
    upload->shards.push_back(*std::move(buffer));
  }
  upload->written.resize(manifest.shards_size());
  BeginResult result{.upload_id = upload->id, .expire_time = upload->expire_time};
  for (const auto& shard : upload->shards) result.shards.push_back(shard.get());
  uploads_[upload->id] = std::move(upload);
  return result;
}

absl::StatusOr<AdapterStore::Upload*> AdapterStore::OpenUpload(absl::string_view upload_id) {
  auto it = uploads_.find(upload_id);
  if (it == uploads_.end() || Expired(*it->second, options_.clock->Now())) {
    return absl::NotFoundError(absl::StrCat("upload ", upload_id, " not found (or expired)"));
  }
  Upload& upload = *it->second;
  switch (upload.state) {
    case Upload::State::kOpen:
      upload.expire_time = options_.clock->Now() + options_.upload_expiry;
      return &upload;
    case Upload::State::kCommitting:
      return absl::FailedPreconditionError(absl::StrCat("upload ", upload_id, " is committing"));
    case Upload::State::kCommitted:
      return absl::FailedPreconditionError(absl::StrCat("upload ", upload_id, " is committed"));
    case Upload::State::kAborted:
      return absl::FailedPreconditionError(absl::StrCat("upload ", upload_id, " is aborted"));
  }
  return absl::InternalError("unreachable upload state");
}

absl::StatusOr<uint64_t> AdapterStore::Put(absl::string_view upload_id, int shard_index,
                                           uint64_t offset, absl::string_view data) {
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<Upload*> upload = OpenUpload(upload_id);
  if (!upload.ok()) return upload.status();
  if (shard_index < 0 || shard_index >= static_cast<int>((*upload)->shards.size())) {
    return InvalidField("shard_index",
                        absl::StrCat("shard_index ", shard_index, " out of range [0, ",
                                     (*upload)->shards.size(), ")"));
  }
  ShardBuffer& shard = *(*upload)->shards[shard_index];
  if (data.empty() || offset > shard.length() || data.size() > shard.length() - offset) {
    return InvalidField(!data.empty() && offset > shard.length() ? "offset" : "data",
                        absl::StrCat("shard ", shard_index, ": ", data.size(), " bytes at offset ",
                                     offset, " do not fit its ", shard.length(), " bytes"));
  }
  // Copying under the lock keeps Commit from reading a half-written chunk.
  std::memcpy(shard.data() + offset, data.data(), data.size());
  ByteRanges& written = (*upload)->written[shard_index];
  written.Add(offset, offset + data.size());
  return written.total();
}

absl::Status AdapterStore::CheckWritten(const Upload& upload) const {
  for (size_t i = 0; i < upload.shards.size(); ++i) {
    const uint64_t size = upload.shards[i]->length();
    // UCX puts are invisible to the store: for such uploads the checksum is the whole proof.
    if (!upload.use_ucx && upload.written[i].total() != size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", i, ": ", upload.written[i].total(), " of ", size, " bytes written"));
    }
  }
  // Replicas hear of the version only after this pass: this thread and a helper share it.
  ParallelTasks checksums;
  for (size_t i = 0; i < upload.shards.size(); ++i) {
    checksums.Add([&upload, i]() -> absl::Status {
      const uint64_t checksum = Xxh3Checksum(upload.shards[i]->bytes());
      if (checksum == upload.manifest.shards(i).xxh3_64()) return absl::OkStatus();
      return absl::AbortedError(absl::StrFormat("shard %d: xxh3 0x%016x != manifest 0x%016x", i,
                                                checksum, upload.manifest.shards(i).xxh3_64()));
    });
  }
  return checksums.Finish();
}

absl::Status AdapterStore::VerifyAndRecord(const Upload& upload,
                                           const weightstore::v1::Manifest& manifest,
                                           bool bound) const {
  absl::Status recorded;
  std::thread recorder([&] { recorded = RecordAnnouncement(options_.data_dir, manifest); });
  const absl::Status verified = CheckWritten(upload);
  recorder.join();
  if (verified.ok()) return recorded;
  // Even a record whose write failed may have been renamed into place.
  if (!bound) ForgetAnnouncement(options_.data_dir, manifest.adapter_name(), manifest.version());
  return verified;
}

bool AdapterStore::Expired(const Upload& upload, absl::Time now) {
  return upload.state == Upload::State::kOpen && upload.expire_time < now;
}

absl::StatusOr<AdapterStore::CommitOutcome> AdapterStore::Commit(absl::string_view upload_id) {
  Upload* upload = nullptr;
  absl::Time begun;  // Read under the lock: past it, a sweep may free the upload.
  bool by_ucx = false;
  bool bound = false;  // An earlier announcement recorded this number's manifest.
  {
    absl::MutexLock lock(&mutex_);
    // A retried commit (its first call's deadline passed, say) waits for the one in progress
    // and answers as it would after it: CommitPublish is idempotent.
    const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      auto it = uploads_.find(upload_id);
      return it == uploads_.end() || it->second->state != Upload::State::kCommitting;
    };
    mutex_.Await(absl::Condition(&settled));
    auto it = uploads_.find(upload_id);
    if (it != uploads_.end() && it->second->state == Upload::State::kCommitted) {
      return CommitOutcome{.version = it->second->committed, .repeated = true};
    }
    absl::StatusOr<Upload*> open = OpenUpload(upload_id);
    if (!open.ok()) return open.status();
    upload = *open;
    upload->state = Upload::State::kCommitting;  // No more puts, no abort, no expiry.
    begun = upload->begun;
    by_ucx = upload->use_ucx;
    const weightstore::v1::Manifest& manifest = upload->manifest;
    auto adapter = adapters_.find(manifest.adapter_name());
    bound = adapter != adapters_.end() && adapter->second.unwritten.contains(manifest.version());
  }
  // Checksums and the durable write of a large adapter take a while: outside the lock.
  CommittedVersion staged{.manifest = upload->manifest};
  *staged.manifest.mutable_commit_time() = ToTimestamp(options_.clock->Now());
  // Read plans (UCX only) key on it: computed beside the checksums rather than once per
  // watcher's plan in the announcement below.
  std::thread keyer;
  if (options_.ucx != nullptr) {
    keyer = std::thread([&staged] { staged.layout_key = PlanLayoutKey(staged.manifest); });
  }
  absl::Status verified = VerifyAndRecord(*upload, staged.manifest, bound);
  if (keyer.joinable()) keyer.join();
  std::shared_ptr<const CommittedVersion> version;
  absl::StatusOr<std::vector<std::function<void(const weightstore::v1::VersionInfo&)>>> listeners;
  {
    absl::MutexLock lock(&mutex_);
    if (!verified.ok()) {
      upload->state = Upload::State::kOpen;  // Re-put and retry.
      return verified;
    }
    staged.shards = std::move(upload->shards);
    version = Share(std::move(staged));
    listeners = Announce(*upload, version);
  }
  if (!listeners.ok()) {
    if (!bound) {  // As for a failed check: a number bound before stays bound.
      ForgetAnnouncement(options_.data_dir, version->manifest.adapter_name(),
                         version->manifest.version());
    }
    return listeners.status();
  }
  // Watchers fetch from memory while the version is written: refits overlap the fsync.
  for (const auto& listener : *listeners) listener(version->Info());
  const absl::Status durable = WriteVersion(options_.data_dir, *version);
  std::vector<RetiredVersion> retired;
  absl::Status settled;
  {
    absl::MutexLock lock(&mutex_);
    settled = SettleWrite(*upload, *version, durable, retired);
  }
  RetireFiles(retired);
  if (!settled.ok()) return settled;
  return CommitOutcome{
      .version = version->Info(), .since_begin = options_.clock->Now() - begun, .by_ucx = by_ucx};
}

absl::StatusOr<std::vector<std::function<void(const weightstore::v1::VersionInfo&)>>>
AdapterStore::Announce(Upload& upload, std::shared_ptr<const CommittedVersion> version) {
  const weightstore::v1::Manifest& manifest = version->manifest;
  Adapter& adapter = adapters_[manifest.adapter_name()];
  const bool overtaken =
      (!adapter.versions.empty() && adapter.versions.rbegin()->first >= manifest.version()) ||
      manifest.version() < adapter.NewestAnnounced();
  if (overtaken) {
    // Overtaken by a newer version: this upload can never commit, and its bytes go with
    // `version`, so it must not stay open looking retryable.
    upload.state = Upload::State::kAborted;
    return absl::FailedPreconditionError(
        absl::StrCat("version ", manifest.version(), " <= newest ", adapter.NewestAnnounced(),
                     " of ", manifest.adapter_name(), " committed meanwhile"));
  }
  adapter.versions[manifest.version()] = std::move(version);
  adapter.writing.insert(manifest.version());
  std::vector<std::function<void(const weightstore::v1::VersionInfo&)>> listeners;
  for (const auto& [id, watcher] : watchers_) {
    if (watcher.adapter == manifest.adapter_name()) listeners.push_back(watcher.listener);
  }
  return listeners;
}

absl::Status AdapterStore::SettleWrite(Upload& upload, const CommittedVersion& version,
                                       const absl::Status& durable,
                                       std::vector<RetiredVersion>& retired) {
  const weightstore::v1::Manifest& manifest = version.manifest;
  Adapter& adapter = adapters_[manifest.adapter_name()];
  adapter.writing.erase(manifest.version());
  if (!durable.ok()) {
    // Announced but not durable: withdrawn, its number kept for these bytes (as after a
    // crash), and the upload aborted since readers may still hold its memory.
    if (auto it = adapter.versions.find(manifest.version()); it != adapter.versions.end()) {
      // Leased memory stays out of the pool until the leases end (RetainLocked).
      if (LeasedLocked(manifest.adapter_name(), manifest.version(), options_.clock->Now())) {
        adapter.withdrawn[manifest.version()] = it->second;
      }
      adapter.versions.erase(it);
    }
    adapter.unwritten[manifest.version()] = manifest;
    upload.state = Upload::State::kAborted;
    absl::Status withdrawn(durable.code(),
                           absl::StrCat(durable.message(), "; ",
                                        VersionName(manifest.adapter_name(), manifest.version()),
                                        " was announced but is not durable: withdrawn, publish it "
                                        "again with the same manifest or publish a newer version"));
    // The write error's details, if any, stay with it.
    durable.ForEachPayload([&withdrawn](absl::string_view type_url, const absl::Cord& payload) {
      withdrawn.SetPayload(type_url, payload);
    });
    return withdrawn;
  }
  adapter.unwritten.erase(adapter.unwritten.begin(),
                          adapter.unwritten.upper_bound(manifest.version()));
  upload.state = Upload::State::kCommitted;
  upload.committed = version.Info();
  upload.expire_time =
      options_.clock->Now() + options_.upload_expiry;  // Remembered for retried commits.
  RetainLocked(manifest.adapter_name(), options_.clock->Now(), retired);
  return absl::OkStatus();
}

absl::Status AdapterStore::Abort(absl::string_view upload_id) {
  absl::MutexLock lock(&mutex_);
  auto it = uploads_.find(upload_id);
  if (it == uploads_.end()) return absl::OkStatus();
  Upload& upload = *it->second;
  if (upload.state == Upload::State::kCommitted || upload.state == Upload::State::kCommitting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "upload ", upload_id,
        upload.state == Upload::State::kCommitted ? " is committed" : " is committing"));
  }
  upload.state = Upload::State::kAborted;
  upload.shards.clear();  // Frees (and deregisters) the memory now.
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CommittedVersion>> AdapterStore::Find(
    absl::string_view adapter, int64_t exact_version, int64_t min_version) const {
  absl::MutexLock lock(&mutex_);
  return FindLocked(adapter, exact_version, min_version);
}

absl::StatusOr<std::shared_ptr<const CommittedVersion>> AdapterStore::FindLocked(
    absl::string_view adapter, int64_t exact_version, int64_t min_version) const {
  auto it = adapters_.find(adapter);
  if (it != adapters_.end() && !it->second.versions.empty()) {
    const auto& versions = it->second.versions;
    if (exact_version > 0) {
      if (auto found = versions.find(exact_version); found != versions.end()) return found->second;
    } else if (versions.rbegin()->first >= min_version) {
      return versions.rbegin()->second;
    }
  }
  const bool lost = it != adapters_.end() && it->second.unwritten.contains(exact_version);
  return absl::NotFoundError(absl::StrCat(
      "no committed version of adapter '", adapter, "' ",
      exact_version > 0 ? absl::StrCat("equal to ", exact_version)
                        : absl::StrCat(">= ", min_version),
      lost ? " (announced, then lost before it was durable: its publisher publishes it again)"
           : " (never committed, or retired)"));
}

weightstore::v1::VersionInfo AdapterStore::Newest(absl::string_view adapter) const {
  absl::MutexLock lock(&mutex_);
  auto it = adapters_.find(adapter);
  if (it == adapters_.end() || it->second.versions.empty()) {
    weightstore::v1::VersionInfo none;
    none.set_adapter_name(std::string(adapter));
    return none;
  }
  return it->second.versions.rbegin()->second->Info();
}

bool AdapterStore::HasOpenUpload(absl::string_view adapter) const {
  absl::MutexLock lock(&mutex_);
  const absl::Time now = options_.clock->Now();
  return std::any_of(uploads_.begin(), uploads_.end(), [&](const auto& entry) {
    const Upload& upload = *entry.second;
    return upload.state == Upload::State::kOpen && !Expired(upload, now) &&
           upload.manifest.adapter_name() == adapter;
  });
}

int64_t AdapterStore::Watch(absl::string_view adapter,
                            std::function<void(const weightstore::v1::VersionInfo&)> listener) {
  absl::MutexLock lock(&mutex_);
  const int64_t id = next_watch_id_++;
  watchers_[id] = {std::string(adapter), std::move(listener)};
  return id;
}

void AdapterStore::Unwatch(int64_t watch_id) {
  absl::MutexLock lock(&mutex_);
  watchers_.erase(watch_id);
}

absl::StatusOr<AdapterStore::Lease> AdapterStore::AcquireLease(absl::string_view adapter,
                                                               int64_t version,
                                                               absl::string_view holder,
                                                               absl::Duration ttl) {
  if (version < 1) {  // Find would take 0 as "the newest", and the lease would pin nothing.
    return InvalidField("version", absl::StrCat("version is ", version, "; must be >= 1"));
  }
  absl::MutexLock lock(&mutex_);
  // Under the lock that retention takes: the version cannot be retired before it is leased.
  if (absl::StatusOr<std::shared_ptr<const CommittedVersion>> found =
          FindLocked(adapter, version, 0);
      !found.ok()) {
    return found.status();
  }
  Lease lease{.id = RandomId("lease"), .expire_time = options_.clock->Now() + ttl};
  leases_[lease.id] = {std::string(adapter), version, std::string(holder), lease.expire_time};
  return lease;
}

absl::StatusOr<absl::Time> AdapterStore::RenewLease(absl::string_view lease_id,
                                                    absl::Duration ttl) {
  absl::MutexLock lock(&mutex_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.expire_time < options_.clock->Now()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " not found or expired"));
  }
  it->second.expire_time = options_.clock->Now() + ttl;
  return it->second.expire_time;
}

void AdapterStore::ReleaseLease(absl::string_view lease_id) {
  absl::MutexLock lock(&mutex_);
  leases_.erase(lease_id);
}

absl::StatusOr<std::shared_ptr<const CommittedVersion>> AdapterStore::LeasedVersion(
    absl::string_view lease_id, absl::string_view adapter, int64_t version) const {
  {
    absl::MutexLock lock(&mutex_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.expire_time < options_.clock->Now()) {
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " not found or expired"));
    }
    if (it->second.adapter != adapter || it->second.version != version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lease ", lease_id, " is for ", VersionName(it->second.adapter, it->second.version)));
    }
  }
  return Find(adapter, version, 0);
}

bool AdapterStore::LeasedLocked(const std::string& adapter, int64_t version, absl::Time now) const {
  for (const auto& [id, lease] : leases_) {
    if (lease.adapter == adapter && lease.version == version && lease.expire_time >= now) {
      return true;
    }
  }
  return false;
}

void AdapterStore::RetainLocked(const std::string& adapter, absl::Time now,
                                std::vector<RetiredVersion>& retired) {
  Adapter& entry = adapters_[adapter];
  auto& versions = entry.versions;
  int kept = 0;
  for (auto it = versions.rbegin(); it != versions.rend();) {
    // A version being written is retired, if at all, once its write settles.
    if (kept++ < options_.keep_versions || entry.writing.contains(it->first) ||
        LeasedLocked(adapter, it->first, now)) {
      ++it;
      continue;
    }
    retired.push_back({adapter, it->first});
    it = std::make_reverse_iterator(versions.erase(std::next(it).base()));
  }
  for (auto it = entry.withdrawn.begin(); it != entry.withdrawn.end();) {
    it = LeasedLocked(adapter, it->first, now) ? std::next(it) : entry.withdrawn.erase(it);
  }
}

void AdapterStore::RetireFiles(const std::vector<RetiredVersion>& retired) const {
  for (const RetiredVersion& version : retired) {
    if (absl::Status status = RetireVersion(options_.data_dir, version.adapter, version.version);
        !status.ok()) {
      spdlog::warn("weight-store: retired {}@{} stays on disk until the next start: {}",
                   version.adapter, version.version, status);
    }
  }
}

void AdapterStore::ExpireAndRetain(absl::Time now) {
  std::vector<RetiredVersion> retired;
  {
    absl::MutexLock lock(&mutex_);
    for (auto it = uploads_.begin(); it != uploads_.end();) {
      auto current = it++;
      if (current->second->state != Upload::State::kCommitting &&
          current->second->expire_time < now) {
        uploads_.erase(current);
      }
    }
    for (auto it = leases_.begin(); it != leases_.end();) {
      auto current = it++;
      if (current->second.expire_time < now) leases_.erase(current);
    }
    for (const auto& [adapter, unused] : adapters_) RetainLocked(adapter, now, retired);
  }
  RetireFiles(retired);
}

AdapterStore::Totals AdapterStore::totals() const {
  absl::MutexLock lock(&mutex_);
  Totals totals;
  for (const auto& [name, adapter] : adapters_) {
    for (const auto& [number, version] : adapter.versions) {
      ++totals.versions;
      totals.bytes += static_cast<int64_t>(version->manifest.total_bytes());
    }
  }
  totals.leases = static_cast<int64_t>(leases_.size());
  for (const auto& [id, upload] : uploads_) {
    totals.open_uploads += upload->state == Upload::State::kOpen;
  }
  return totals;
}

}  // namespace tandem::weight_store
