#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_STORE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_STORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "rocksdb/db.h"
#include "rocksdb/file_system.h"
#include "services/router_replay/client/record_key.h"
#include "services/router_replay/route_codec.h"

namespace tandem::router_replay {

// When appended rows reach stable storage.
enum class SyncPolicy {
  kAlways,         // fsync the log on every write: slowest, nothing buffered at all.
  kOnAcknowledge,  // fsync once before each acknowledgement (Sync()): durable acks, group commit.
  kNever,          // never fsync: survives a process crash (kill -9) but not a machine crash.
};
absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name);

// What opening the store does with a damaged route log (RocksDB's WAL), e.g. one truncated by
// a disk fault after its records were acknowledged.
enum class WalRecovery {
  kRefuse,       // Refuse to open, naming the damage: acknowledged records are never dropped
                 // silently. The default.
  kPointInTime,  // Keep everything before the damage and drop the rest (logged): an
                 // operator's choice after looking at the damage.
};
absl::StatusOr<WalRecovery> ParseWalRecovery(absl::string_view name);

struct RouteStoreOptions {
  std::string path;
  SyncPolicy sync = SyncPolicy::kOnAcknowledge;
  int zstd_level = 1;  // <= 0: bit-packing only.
  // Memory bounds: the write buffer spills to disk when full; the block cache holds read blocks.
  int64_t write_buffer_bytes = int64_t{64} << 20;
  int64_t block_cache_bytes = int64_t{64} << 20;
  WalRecovery wal_recovery = WalRecovery::kRefuse;
  // Where files live; null: the local disk. Tests inject faults (a disk that fills up).
  std::shared_ptr<rocksdb::FileSystem> file_system;
  // What records' update times (the TTL sweep's cutoff compares them) read; not owned.
  Clock* clock = &Clock::Real();
};

// Stored state of one record.
struct RecordInfo {
  RecordKey key;
  RouteShape shape;
  int64_t rows = 0;
  bool sealed = false;
  int64_t stored_bytes = 0;
  absl::Time updated;
};

// Consecutive rows [first_row, first_row + num_rows) of one record, [num_rows, layers, top_k].
struct RouteChunk {
  RecordKey key;
  RouteShape shape;
  int64_t first_row = 0;
  int64_t num_rows = 0;
  const int16_t* rows = nullptr;
  bool seal = false;  // Seal at first_row + num_rows after storing.
};

struct AppendOutcome {
  int64_t rows = 0;  // Rows stored for the record afterwards.
  bool sealed = false;
  int64_t new_rows = 0;      // Rows this chunk added (0 for an identical retry).
  int64_t stored_bytes = 0;  // Encoded bytes this chunk added.
  BlockEncoding encoding = BlockEncoding::kPacked;
};

struct DeleteOutcome {
  int64_t records = 0;
  int64_t bytes = 0;
};

// Records currently held, for gauges.
struct StoreTotals {
  int64_t open_records = 0;
  int64_t sealed_records = 0;
  int64_t stored_bytes = 0;
};

// Durable routing records in an embedded RocksDB: per record a metadata entry and encoded
// blocks keyed by their first row, in one WriteBatch per append so a record is never torn.
// Memory stays bounded by the write buffer and block cache; the rest lives on disk.
// Thread-safe: appends to one record serialize on a lock stripe, different records proceed
// in parallel.
class RouteStore {
 public:
  static absl::StatusOr<std::unique_ptr<RouteStore>> Open(const RouteStoreOptions& options);
  ~RouteStore();

  // Validates and stores a chunk (see the Append RPC for every rule and message). Rows that
  // overlap stored ones must be identical (a retry), else ABORTED naming the first difference.
  absl::StatusOr<AppendOutcome> Append(const RouteChunk& chunk);

  // Seals a record at total_rows; sealing again at the same total is a no-op.
  absl::StatusOr<RecordInfo> Seal(const RecordKey& key, int64_t total_rows);

  // Makes every write so far survive a machine crash, as the sync policy asks.
  absl::Status Sync();

  // NOT_FOUND "record <key> not found" when absent.
  absl::StatusOr<RecordInfo> Get(const RecordKey& key) const;

  // Rows [begin, end) of a record into out [end - begin, layers, top_k]; rows past the stored
  // ones are -1. NOT_FOUND when the record was deleted (DeleteRecords, the TTL sweep) since
  // `record` was read: its rows are gone, and -1 in their place would pass for stored rows.
  absl::Status ReadRows(const RecordInfo& record, int64_t begin, int64_t end, int16_t* out) const;

  // Records of a job with policy versions in [version_begin, version_end) (end 0: unbounded),
  // ordered by (version, sample, attempt).
  absl::StatusOr<std::vector<RecordInfo>> ListJob(absl::string_view job_id, int64_t version_begin,
                                                  int64_t version_end) const;

  // Deletes a job's records in a version range, sealed or not.
  absl::StatusOr<DeleteOutcome> DeleteJob(absl::string_view job_id, int64_t version_begin,
                                          int64_t version_end);

  // Deletes records whose last append or seal is before `cutoff` (the TTL sweep).
  absl::StatusOr<DeleteOutcome> DeleteUpdatedBefore(absl::Time cutoff);

  StoreTotals totals() const;
  // The clock records' update times are read from (RouteStoreOptions::clock).
  Clock& clock() const { return *options_.clock; }

 private:
  RouteStore(std::unique_ptr<rocksdb::Env> env, std::unique_ptr<rocksdb::DB> db,
             const RouteStoreOptions& options);

  absl::Mutex& StripeFor(absl::string_view encoded_key) const;
  absl::Status LoadTotals();
  absl::StatusOr<AppendOutcome> AppendLocked(const RouteChunk& chunk, const std::string& encoded);
  absl::Status CompareOverlap(const RecordInfo& record, const RouteChunk& chunk,
                              int64_t overlap_end) const;
  absl::Status DeleteRecords(const std::vector<RecordInfo>& records,
                             const std::function<bool(const RecordInfo&)>& still_matches,
                             DeleteOutcome& outcome);
  // Writes `batch` once the disk has room for it (ReserveRoom); deletions may use the room kept
  // for flushes, since they are how space is freed.
  absl::Status Write(rocksdb::WriteBatch& batch, bool deleting = false);
  // RESOURCE_EXHAUSTED, naming the path and the bytes free, unless the disk holds `bytes` more
  // beside the writes in flight and (unless `deleting`) the memtables' next flush.
  absl::Status ReserveRoom(int64_t bytes, bool deleting) const;

  std::unique_ptr<rocksdb::Env> env_;  // Set with options.file_system; outlives db_.
  std::unique_ptr<rocksdb::DB> db_;
  RouteStoreOptions options_;
  mutable std::array<absl::Mutex, 64> stripes_;
  std::atomic<int64_t> open_records_{0};
  std::atomic<int64_t> sealed_records_{0};
  std::atomic<int64_t> stored_bytes_{0};
  std::atomic<int64_t> bytes_in_flight_{0};  // Of writes between ReserveRoom and their end.
};

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_STORE_H_
