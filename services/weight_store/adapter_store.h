#ifndef TANDEM_SERVICES_WEIGHT_STORE_ADAPTER_STORE_H_
#define TANDEM_SERVICES_WEIGHT_STORE_ADAPTER_STORE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "services/weight_store/byte_ranges.h"
#include "services/weight_store/shard_buffer.h"
#include "services/weight_store/version_files.h"
#include "tandem/weightstore/v1/weight_store.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

struct AdapterStoreOptions {
  std::string data_dir;   // Committed versions live here and are recovered from here.
  int keep_versions = 3;  // Newest committed versions kept per adapter (plus leased ones).
  absl::Duration upload_expiry = absl::Minutes(15);
  transfer::UcxWorker* ucx = nullptr;  // Not owned; null: gRPC data path only.
  // Memory of retired versions kept for new uploads of the same shard sizes (ShardBufferPool).
  size_t pooled_bytes = size_t{1} << 30;
  // What upload and lease expiry, retention and commit times read; not owned.
  Clock* clock = &Clock::Real();
};

struct BeginResult {
  std::string upload_id;
  absl::Time expire_time;
  std::vector<const ShardBuffer*> shards;  // Put targets (valid while the upload is open).
};

// Versioned LoRA adapters: uploads, atomic commit, persistence and recovery, watch, leases and
// retention. Thread-safe. See weight_store.proto for every rule and message.
class AdapterStore {
 public:
  static absl::StatusOr<std::unique_ptr<AdapterStore>> Open(const AdapterStoreOptions& options);
  ~AdapterStore();

  // use_ucx: the producer puts the bytes by UCX (FAILED_PRECONDITION without a UCX worker);
  // otherwise every byte must arrive through Put before Commit.
  absl::StatusOr<BeginResult> Begin(const weightstore::v1::Manifest& manifest, bool use_ucx);
  // Writes bytes of an open upload's shard; returns the distinct bytes written to it so far.
  absl::StatusOr<uint64_t> Put(absl::string_view upload_id, int shard_index, uint64_t offset,
                               absl::string_view data);
  struct CommitOutcome {
    weightstore::v1::VersionInfo version;
    absl::Duration since_begin;  // Publish latency.
    bool by_ucx = false;         // The bytes came by UCX puts.
    bool repeated = false;       // A retry of a commit that had already succeeded.
  };
  // Verifies the version, announces it to watchers and makes it durable (fsync) while they
  // fetch; returns once it is durable. Idempotent once committed.
  absl::StatusOr<CommitOutcome> Commit(absl::string_view upload_id);
  absl::Status Abort(absl::string_view upload_id);

  // NOT_FOUND unless a matching committed version is held. version: exact (> 0), or the newest
  // that is >= min_version (min_version 0: newest).
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> Find(absl::string_view adapter,
                                                               int64_t exact_version,
                                                               int64_t min_version) const;
  // The newest committed version (version 0 if none).
  weightstore::v1::VersionInfo Newest(absl::string_view adapter) const;
  // Whether an upload of `adapter` is open (begun, not committed, aborted or expired).
  bool HasOpenUpload(absl::string_view adapter) const;

  // Calls `listener` (on the committing thread, without store locks held) after each commit
  // of `adapter`, listeners in the order they were registered; returns an id for Unwatch.
  int64_t Watch(absl::string_view adapter,
                std::function<void(const weightstore::v1::VersionInfo&)> listener);
  void Unwatch(int64_t watch_id);

  struct Lease {
    std::string id;
    absl::Time expire_time;
  };
  absl::StatusOr<Lease> AcquireLease(absl::string_view adapter, int64_t version,
                                     absl::string_view holder, absl::Duration ttl);
  absl::StatusOr<absl::Time> RenewLease(absl::string_view lease_id, absl::Duration ttl);
  void ReleaseLease(absl::string_view lease_id);
  // The leased version, NOT_FOUND if the lease is unknown or expired, FAILED_PRECONDITION if
  // it is for another version.
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> LeasedVersion(absl::string_view lease_id,
                                                                        absl::string_view adapter,
                                                                        int64_t version) const;

  // Drops expired uploads and leases and applies retention; the service calls it periodically.
  void ExpireAndRetain(absl::Time now);

  struct Totals {
    int64_t versions = 0;
    int64_t bytes = 0;
    int64_t leases = 0;
    int64_t open_uploads = 0;
  };
  Totals totals() const;

 private:
  struct Upload {
    enum class State { kOpen, kCommitting, kCommitted, kAborted };

    std::string id;
    weightstore::v1::Manifest manifest;
    std::vector<std::unique_ptr<ShardBuffer>> shards;
    std::vector<ByteRanges> written;
    bool use_ucx = false;
    absl::Time begun;
    absl::Time expire_time;
    State state = State::kOpen;
    weightstore::v1::VersionInfo committed;
  };
  struct Adapter {
    // Announced versions: durable, or being written (`writing`).
    std::map<int64_t, std::shared_ptr<const CommittedVersion>> versions;
    std::set<int64_t> writing;
    // Versions announced but never made durable (the store crashed, or the write failed),
    // newer than every durable one: the manifest each number stays bound to.
    std::map<int64_t, weightstore::v1::Manifest> unwritten;
    // Withdrawn versions (their write failed) whose memory readers may still hold leases on:
    // kept out of the pool until no lease names them.
    std::map<int64_t, std::shared_ptr<const CommittedVersion>> withdrawn;
    // The newest version ever announced, durable or not (0: none).
    int64_t NewestAnnounced() const {
      return std::max(versions.empty() ? 0 : versions.rbegin()->first,
                      unwritten.empty() ? 0 : unwritten.rbegin()->first);
    }
  };
  struct LeaseRecord {
    std::string adapter;
    int64_t version = 0;
    std::string holder;
    absl::Time expire_time;
  };

  explicit AdapterStore(const AdapterStoreOptions& options)
      : options_(options),
        pool_(std::make_shared<ShardBufferPool>(options.ucx, options.pooled_bytes)) {}

  // A committed version shared with readers; when the last one lets go of a retired version its
  // buffers return to the pool.
  std::shared_ptr<const CommittedVersion> Share(CommittedVersion version) const;

  absl::Status Recover();
  absl::StatusOr<std::shared_ptr<const CommittedVersion>> FindLocked(absl::string_view adapter,
                                                                     int64_t exact_version,
                                                                     int64_t min_version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<Upload*> OpenUpload(absl::string_view upload_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // An open upload past its expiry is gone for every caller, even before the sweep frees it.
  static bool Expired(const Upload& upload, absl::Time now);
  struct RetiredVersion {
    std::string adapter;
    int64_t version = 0;
  };
  absl::Status CheckWritten(const Upload& upload) const;
  // Verifies the upload and records `manifest` durably (RecordAnnouncement): after a crash that
  // loses the version's shards, its number still names these bytes and no others. The record's
  // fsync waits on the disk, not the CPU, so it is written while the checksums are verified; if
  // they fail, it is removed again unless `bound` (an earlier announcement wrote it).
  absl::Status VerifyAndRecord(const Upload& upload, const weightstore::v1::Manifest& manifest,
                               bool bound) const;
  // Makes a verified upload's version readable and returns the listeners to announce it to;
  // FAILED_PRECONDITION if a newer version was announced meanwhile.
  absl::StatusOr<std::vector<std::function<void(const weightstore::v1::VersionInfo&)>>> Announce(
      Upload& upload, std::shared_ptr<const CommittedVersion> version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Ends an announced version's write: committed when `durable` is OK, withdrawn otherwise.
  absl::Status SettleWrite(Upload& upload, const CommittedVersion& version,
                           const absl::Status& durable, std::vector<RetiredVersion>& retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops the adapter's versions past retention, adding them to `retired` for RetireFiles once
  // the lock is released: file work under it would stall every call.
  void RetainLocked(const std::string& adapter, absl::Time now,
                    std::vector<RetiredVersion>& retired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RetireFiles(const std::vector<RetiredVersion>& retired) const;
  bool LeasedLocked(const std::string& adapter, int64_t version, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const AdapterStoreOptions options_;
  const std::shared_ptr<ShardBufferPool> pool_;  // Shared with the versions' deleters.
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, Adapter> adapters_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, std::unique_ptr<Upload>> uploads_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, LeaseRecord> leases_ ABSL_GUARDED_BY(mutex_);
  struct Watcher {
    std::string adapter;
    std::function<void(const weightstore::v1::VersionInfo&)> listener;
  };
  std::map<int64_t, Watcher> watchers_ ABSL_GUARDED_BY(mutex_);
  int64_t next_watch_id_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_ADAPTER_STORE_H_
