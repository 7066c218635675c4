#include "services/router_replay/route_store.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "absl/base/internal/endian.h"
#include "absl/cleanup/cleanup.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "rocksdb/cache.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "tandem/internal/v1/route_record.pb.h"

namespace tandem::router_replay {
namespace {

// Key spaces: metadata "m<record>", blocks "b<record><first row, big-endian>". Encoded record
// keys are prefix-free, so a record's blocks are exactly the keys starting with "b<record>".
constexpr char kMetaSpace = 'm';
constexpr char kBlockSpace = 'b';

std::string MetaKey(absl::string_view encoded) { return absl::StrCat("m", encoded); }

std::string BlockPrefix(absl::string_view encoded) { return absl::StrCat("b", encoded); }

std::string BlockKey(absl::string_view encoded, int64_t first_row) {
  std::string key = BlockPrefix(encoded);
  char row[8];
  absl::big_endian::Store64(row, static_cast<uint64_t>(first_row));
  key.append(row, sizeof(row));
  return key;
}

// The first key after every key that starts with `prefix` (prefixes here never end in 0xff).
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
  return prefix;
}

// How often a store refusing writes after a full disk tries to resume.
constexpr absl::Duration kResumeRetryInterval = absl::Milliseconds(200);
// Room an append leaves free beyond the memtables' next flush (RocksDB's manifest, info log).
constexpr int64_t kFlushHeadroomBytes = int64_t{1} << 20;

absl::Status FromRocks(const rocksdb::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  // A full disk is RESOURCE_EXHAUSTED in every service (with the path in the message).
  if (status.IsNoSpace() || status.subcode() == rocksdb::Status::kNoSpace) {
    return absl::ResourceExhaustedError(message);
  }
  if (status.IsIOError()) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

internal::v1::StoredRecord ToStored(const RecordInfo& record) {
  internal::v1::StoredRecord stored;
  stored.mutable_layers()->Add(record.shape.layers.begin(), record.shape.layers.end());
  stored.set_top_k(record.shape.top_k);
  stored.set_num_experts(record.shape.num_experts);
  stored.set_rows(record.rows);
  stored.set_sealed(record.sealed);
  stored.set_stored_bytes(record.stored_bytes);
  stored.set_update_time_unix_ms(absl::ToUnixMillis(record.updated));
  return stored;
}

absl::StatusOr<RecordInfo> FromStored(RecordKey key, absl::string_view bytes) {
  internal::v1::StoredRecord stored;
  if (!stored.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("corrupt metadata of record ", ToString(key)));
  }
  RecordInfo record;
  record.key = std::move(key);
  record.shape.layers.assign(stored.layers().begin(), stored.layers().end());
  record.shape.top_k = stored.top_k();
  record.shape.num_experts = stored.num_experts();
  record.rows = stored.rows();
  record.sealed = stored.sealed();
  record.stored_bytes = stored.stored_bytes();
  record.updated = absl::FromUnixMillis(stored.update_time_unix_ms());
  return record;
}

absl::Status CheckSameShape(const RecordInfo& record, const RouteShape& shape) {
  const std::string key = ToString(record.key);
  if (record.shape.layers != shape.layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "record ", key, ": layers differ (stored [", absl::StrJoin(record.shape.layers, ","),
        "], chunk [", absl::StrJoin(shape.layers, ","), "])"));
  }
  if (record.shape.top_k != shape.top_k) {
    return absl::FailedPreconditionError(absl::StrCat("record ", key, ": top_k differs (stored ",
                                                      record.shape.top_k, ", chunk ", shape.top_k,
                                                      ")"));
  }
  if (record.shape.num_experts != shape.num_experts) {
    return absl::FailedPreconditionError(
        absl::StrCat("record ", key, ": num_experts differs (stored ", record.shape.num_experts,
                     ", chunk ", shape.num_experts, ")"));
  }
  return absl::OkStatus();
}

// Visits every metadata entry whose key lies in [begin, end).
absl::Status ScanRecords(rocksdb::DB& db, const std::string& begin, const std::string& end,
                         const std::function<absl::Status(RecordInfo)>& visit) {
  rocksdb::ReadOptions read_options;
  const rocksdb::Slice upper(end);
  read_options.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(read_options));
  for (it->Seek(begin); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    absl::StatusOr<RecordKey> record_key =
        DecodeRecordKey(absl::string_view(key.data() + 1, key.size() - 1));
    if (!record_key.ok()) return record_key.status();
    absl::StatusOr<RecordInfo> record = FromStored(
        *std::move(record_key), absl::string_view(it->value().data(), it->value().size()));
    if (!record.ok()) return record.status();
    if (absl::Status status = visit(*std::move(record)); !status.ok()) return status;
  }
  return FromRocks(it->status(), "scanning records");
}

}  // namespace

absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name) {
  if (name == "always") return SyncPolicy::kAlways;
  if (name == "ack") return SyncPolicy::kOnAcknowledge;
  if (name == "never") return SyncPolicy::kNever;
  return InvalidRequest("INVALID_OPTION", absl::StrCat("bad fsync policy '", name,
                                                       "'; expected always, ack or never"));
}

absl::StatusOr<WalRecovery> ParseWalRecovery(absl::string_view name) {
  if (name == "refuse") return WalRecovery::kRefuse;
  if (name == "point_in_time") return WalRecovery::kPointInTime;
  return InvalidRequest("INVALID_OPTION", absl::StrCat("bad WAL recovery '", name,
                                                       "'; expected refuse or point_in_time"));
}

absl::StatusOr<std::unique_ptr<RouteStore>> RouteStore::Open(const RouteStoreOptions& options) {
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  // kAbsoluteConsistency: any damage in the log fails the open instead of silently ending
  // replay at the damage (RocksDB's default), which once dropped 6,611 acknowledged records.
  db_options.wal_recovery_mode = options.wal_recovery == WalRecovery::kRefuse
                                     ? rocksdb::WALRecoveryMode::kAbsoluteConsistency
                                     : rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  // After a full disk RocksDB refuses writes until it has recovered, which it retries on its
  // own: soon, so appends work again shortly after space is freed, with no restart.
  db_options.bgerror_resume_retry_interval = absl::ToInt64Microseconds(kResumeRetryInterval);
  std::unique_ptr<rocksdb::Env> env;
  if (options.file_system != nullptr) {
    env = rocksdb::NewCompositeEnv(options.file_system);
    db_options.env = env.get();
  }
  db_options.write_buffer_size = static_cast<size_t>(options.write_buffer_bytes);
  db_options.max_write_buffer_number = 2;
  // Blocks are already bit-packed and zstd-compressed; compressing again only costs time.
  db_options.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table_options;
  table_options.block_cache = rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
  db_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));
  // RocksDB creates the database directory but not its parents (a --data_dir under a fresh
  // volume path).
  std::error_code created;
  std::filesystem::create_directories(options.path, created);
  if (created) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", options.path, ": ", created.message()));
  }
  rocksdb::DB* db = nullptr;
  const rocksdb::Status opened = rocksdb::DB::Open(db_options, options.path, &db);
  if (!opened.ok() && options.wal_recovery == WalRecovery::kRefuse && opened.IsCorruption()) {
    return absl::DataLossError(absl::StrCat(
        "the route log under ", options.path, " is damaged (", opened.ToString(),
        "); not starting, since acknowledged records could be lost. Keep a copy of the "
        "directory; --wal_recovery=point_in_time starts with everything before the damage"));
  }
  if (absl::Status status = FromRocks(opened, "opening " + options.path); !status.ok()) {
    return status;
  }
  if (options.wal_recovery == WalRecovery::kPointInTime) {
    spdlog::warn(
        "router-replay: opened {} with --wal_recovery=point_in_time: records after any "
        "damage in the route log are gone",
        options.path);
  }
  std::unique_ptr<RouteStore> store(
      new RouteStore(std::move(env), std::unique_ptr<rocksdb::DB>(db), options));
  if (absl::Status status = store->LoadTotals(); !status.ok()) return status;
  return store;
}

RouteStore::RouteStore(std::unique_ptr<rocksdb::Env> env, std::unique_ptr<rocksdb::DB> db,
                       const RouteStoreOptions& options)
    : env_(std::move(env)), db_(std::move(db)), options_(options) {}

RouteStore::~RouteStore() {
  if (db_ != nullptr) db_->Close().PermitUncheckedError();
}

absl::Mutex& RouteStore::StripeFor(absl::string_view encoded_key) const {
  return stripes_[absl::Hash<absl::string_view>{}(encoded_key) % stripes_.size()];
}

absl::Status RouteStore::LoadTotals() {
  return ScanRecords(*db_, std::string(1, kMetaSpace), std::string(1, kMetaSpace + 1),
                     [this](RecordInfo record) {
                       (record.sealed ? sealed_records_ : open_records_)++;
                       stored_bytes_ += record.stored_bytes;
                       return absl::OkStatus();
                     });
}

// RocksDB 7.8 aborts on an assertion (WritableFileWriter::AssertFalseAndGetStatusForPrevError)
// when it appends to or syncs a log file whose earlier append failed, which a full disk causes
// (upstream fixed it later: facebook/rocksdb#12448). So the route log must never run out of
// space: a write goes ahead only while the disk keeps room for it, for the writes in flight
// beside it and for flushing the memtables; otherwise it is refused, and goes ahead once space
// is freed. A flush that fails for space is safe: RocksDB stops writes and resumes on its own.
absl::Status RouteStore::ReserveRoom(int64_t bytes, bool deleting) const {
  std::error_code error;
  const std::filesystem::space_info space = std::filesystem::space(options_.path, error);
  if (error) return absl::OkStatus();  // Cannot tell: RocksDB's own errors still apply.
  uint64_t memtables = 0;
  if (!deleting) db_->GetIntProperty("rocksdb.cur-size-all-mem-tables", &memtables);
  const int64_t needed = bytes_in_flight_.load() + (deleting ? 0 : kFlushHeadroomBytes) +
                         static_cast<int64_t>(memtables);
  if (static_cast<int64_t>(space.available) >= needed) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the disk under ", options_.path, " is full: ", space.available, " bytes free, ", needed,
      " needed for this write, the writes in flight and the route log's next flush; appends "
      "resume once space is freed"));
}

absl::Status RouteStore::Write(rocksdb::WriteBatch& batch, bool deleting) {
  const int64_t bytes = static_cast<int64_t>(batch.GetDataSize());
  bytes_in_flight_ += bytes;
  const absl::Cleanup done = [&] { bytes_in_flight_ -= bytes; };
  if (absl::Status status = ReserveRoom(bytes, deleting); !status.ok()) return status;
  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync == SyncPolicy::kAlways;
  return FromRocks(db_->Write(write_options, &batch),
                   absl::StrCat("writing routes under ", options_.path));
}

absl::Status RouteStore::Sync() {
  if (options_.sync != SyncPolicy::kOnAcknowledge) return absl::OkStatus();
  return FromRocks(db_->SyncWAL(), "syncing the route log");
}

absl::StatusOr<RecordInfo> RouteStore::Get(const RecordKey& key) const {
  std::string bytes;
  const rocksdb::Status status =
      db_->Get(rocksdb::ReadOptions(), MetaKey(EncodeRecordKey(key)), &bytes);
  if (status.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("record ", ToString(key), " not found"));
  }
  if (absl::Status error = FromRocks(status, "reading a record"); !error.ok()) return error;
  return FromStored(key, bytes);
}

absl::StatusOr<AppendOutcome> RouteStore::Append(const RouteChunk& chunk) {
  if (absl::Status status = ValidateRecordKey(chunk.key); !status.ok()) return status;
  if (absl::Status status = ValidateShape(chunk.shape); !status.ok()) return status;
  if (chunk.first_row < 0 || chunk.num_rows < 1) {
    return InvalidField(
        chunk.first_row < 0 ? "token_offset" : "num_tokens",
        absl::StrCat("record ", ToString(chunk.key), ": token_offset ", chunk.first_row,
                     " and num_tokens ", chunk.num_rows, " must be >= 0 and >= 1"));
  }
  if (absl::Status status = ValidateRows(chunk.shape, chunk.rows, chunk.num_rows, chunk.first_row);
      !status.ok()) {
    return Annotate(status, absl::StrCat("record ", ToString(chunk.key), " "));
  }
  const std::string encoded = EncodeRecordKey(chunk.key);
  absl::MutexLock lock(&StripeFor(encoded));
  return AppendLocked(chunk, encoded);
}

absl::StatusOr<AppendOutcome> RouteStore::AppendLocked(const RouteChunk& chunk,
                                                       const std::string& encoded) {
  const std::string key_name = ToString(chunk.key);
  absl::StatusOr<RecordInfo> found = Get(chunk.key);
  if (!found.ok() && !absl::IsNotFound(found.status())) return found.status();
  const bool is_new = !found.ok();
  RecordInfo record = is_new ? RecordInfo{.key = chunk.key, .shape = chunk.shape} : *found;
  if (absl::Status status = CheckSameShape(record, chunk.shape); !status.ok()) return status;
  const int64_t chunk_end = chunk.first_row + chunk.num_rows;
  // First: past a sealed end, whether the chunk leaves a gap or differs, it can never go in.
  if (record.sealed && chunk_end > record.rows) {
    return absl::FailedPreconditionError(
        absl::StrCat("record ", key_name, " sealed at ", record.rows, " rows"));
  }
  if (chunk.first_row > record.rows) {
    return absl::FailedPreconditionError(absl::StrCat("record ", key_name, " has ", record.rows,
                                                      " rows, chunk starts at ", chunk.first_row));
  }
  if (const int64_t overlap_end = std::min(chunk_end, record.rows); overlap_end > chunk.first_row) {
    if (absl::Status status = CompareOverlap(record, chunk, overlap_end); !status.ok()) {
      return status;
    }
  }
  if (chunk.seal && chunk_end != record.rows && chunk_end < record.rows) {
    return absl::FailedPreconditionError(
        absl::StrCat("record ", key_name, " has ", record.rows, " rows, seal says ", chunk_end));
  }
  AppendOutcome outcome;
  rocksdb::WriteBatch batch;
  if (chunk_end > record.rows) {
    const int64_t skip = record.rows - chunk.first_row;
    outcome.new_rows = chunk_end - record.rows;
    const std::string block =
        EncodeBlock(chunk.shape, chunk.rows + skip * chunk.shape.ids_per_row(), outcome.new_rows,
                    options_.zstd_level);
    outcome.encoding = *EncodingOf(block);
    outcome.stored_bytes = static_cast<int64_t>(block.size());
    batch.Put(BlockKey(encoded, record.rows), block);
    record.rows = chunk_end;
    record.stored_bytes += outcome.stored_bytes;
  }
  const bool seals_now = chunk.seal && !record.sealed;
  record.sealed = record.sealed || chunk.seal;
  if (outcome.new_rows > 0 || seals_now) {
    record.updated = options_.clock->Now();
    batch.Put(MetaKey(encoded), ToStored(record).SerializeAsString());
    if (absl::Status status = Write(batch); !status.ok()) return status;
    if (is_new) ++(record.sealed ? sealed_records_ : open_records_);
    if (!is_new && seals_now) --open_records_, ++sealed_records_;
    stored_bytes_ += outcome.stored_bytes;
  }
  outcome.rows = record.rows;
  outcome.sealed = record.sealed;
  return outcome;
}

absl::Status RouteStore::CompareOverlap(const RecordInfo& record, const RouteChunk& chunk,
                                        int64_t overlap_end) const {
  const int64_t ids_per_row = chunk.shape.ids_per_row();
  std::vector<int16_t> stored((overlap_end - chunk.first_row) * ids_per_row);
  if (absl::Status status = ReadRows(record, chunk.first_row, overlap_end, stored.data());
      !status.ok()) {
    return status;
  }
  const auto [stored_at, chunk_at] = std::mismatch(stored.begin(), stored.end(), chunk.rows);
  if (stored_at == stored.end()) return absl::OkStatus();
  const int64_t index = stored_at - stored.begin();
  const int64_t k = chunk.shape.top_k;
  const int64_t layers = static_cast<int64_t>(chunk.shape.layers.size());
  return absl::AbortedError(absl::StrCat(
      "record ", ToString(chunk.key), " differs from stored rows at row ",
      chunk.first_row + index / ids_per_row, ", layer ", chunk.shape.layers[(index / k) % layers],
      ", slot ", index % k, " (stored ", *stored_at, ", chunk ", *chunk_at, ")"));
}

absl::StatusOr<RecordInfo> RouteStore::Seal(const RecordKey& key, int64_t total_rows) {
  if (absl::Status status = ValidateRecordKey(key); !status.ok()) return status;
  if (total_rows < 1) {
    return InvalidField("total_rows", absl::StrCat("record ", ToString(key), ": total_rows ",
                                                   total_rows, " must be >= 1"));
  }
  const std::string encoded = EncodeRecordKey(key);
  absl::MutexLock lock(&StripeFor(encoded));
  absl::StatusOr<RecordInfo> record = Get(key);
  if (!record.ok()) return record.status();
  if (record->sealed) {
    if (record->rows == total_rows) return record;
    return absl::FailedPreconditionError(absl::StrCat(
        "record ", ToString(key), " sealed at ", record->rows, " rows, seal says ", total_rows));
  }
  if (record->rows != total_rows) {
    return absl::FailedPreconditionError(absl::StrCat(
        "record ", ToString(key), " has ", record->rows, " rows, seal says ", total_rows));
  }
  record->sealed = true;
  record->updated = options_.clock->Now();
  rocksdb::WriteBatch batch;
  batch.Put(MetaKey(encoded), ToStored(*record).SerializeAsString());
  if (absl::Status status = Write(batch); !status.ok()) return status;
  --open_records_;
  ++sealed_records_;
  return record;
}

absl::Status RouteStore::ReadRows(const RecordInfo& record, int64_t begin, int64_t end,
                                  int16_t* out) const {
  const int64_t ids_per_row = record.shape.ids_per_row();
  std::fill(out, out + (end - begin) * ids_per_row, int16_t{-1});
  const std::string encoded = EncodeRecordKey(record.key);
  const std::string prefix = BlockPrefix(encoded);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  std::vector<int16_t> decoded;
  int64_t found = 0;  // Rows of [begin, min(end, record.rows)) found in blocks.
  // Blocks tile [0, rows) from row 0, so the block holding `begin` is the last one starting at
  // or before it.
  for (it->SeekForPrev(BlockKey(encoded, begin)); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    const int64_t block_first =
        static_cast<int64_t>(absl::big_endian::Load64(it->key().data() + prefix.size()));
    // Blocks are only ever added at a record's end, so those appended since `record` was read
    // start at or past its rows: not part of this reader's view, whose later rows stay -1.
    if (block_first >= end || block_first >= record.rows) break;
    const absl::string_view block(it->value().data(), it->value().size());
    absl::StatusOr<int64_t> block_rows = RowsOf(block);
    if (!block_rows.ok()) return block_rows.status();
    // The header is read before anything else checks the block: bound it by the record first.
    if (*block_rows <= 0 || block_first + *block_rows > record.rows) {
      return absl::DataLossError(absl::StrCat("corrupt route block of ", ToString(record.key),
                                              " at row ", block_first, ": header says ",
                                              *block_rows, " rows, record has ", record.rows));
    }
    decoded.resize(*block_rows * ids_per_row);
    if (absl::Status status = DecodeBlock(record.shape, block, decoded.data()); !status.ok()) {
      return status;
    }
    const int64_t from = std::max(begin, block_first);
    const int64_t to = std::min(end, block_first + *block_rows);
    if (to > from) {
      std::copy(decoded.begin() + (from - block_first) * ids_per_row,
                decoded.begin() + (to - block_first) * ids_per_row,
                out + (from - begin) * ids_per_row);
      found += to - from;
    }
  }
  if (absl::Status status = FromRocks(it->status(), "reading routes"); !status.ok()) return status;
  // Blocks are only ever removed with their record, in one batch: rows of `record` missing here
  // mean the record was deleted after `record` was read.
  if (found < std::min(end, record.rows) - begin) {
    return absl::NotFoundError(
        absl::StrCat("record ", ToString(record.key), " was deleted while being read"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RecordInfo>> RouteStore::ListJob(absl::string_view job_id,
                                                            int64_t version_begin,
                                                            int64_t version_end) const {
  std::vector<RecordInfo> records;
  const std::string begin = absl::StrCat("m", JobVersionPrefix(job_id, version_begin));
  const std::string end = version_end > 0 ? absl::StrCat("m", JobVersionPrefix(job_id, version_end))
                                          : absl::StrCat("m", JobPrefixEnd(job_id));
  absl::Status status = ScanRecords(*db_, begin, end, [&](RecordInfo record) {
    records.push_back(std::move(record));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return records;
}

absl::Status RouteStore::DeleteRecords(const std::vector<RecordInfo>& records,
                                       const std::function<bool(const RecordInfo&)>& still_matches,
                                       DeleteOutcome& outcome) {
  for (const RecordInfo& record : records) {
    const std::string encoded = EncodeRecordKey(record.key);
    absl::MutexLock lock(&StripeFor(encoded));
    // Re-read under the lock: an append may have grown the record since the scan.
    absl::StatusOr<RecordInfo> current = Get(record.key);
    if (absl::IsNotFound(current.status())) continue;
    if (!current.ok()) return current.status();
    if (!still_matches(*current)) continue;
    rocksdb::WriteBatch batch;
    batch.Delete(MetaKey(encoded));
    const std::string prefix = BlockPrefix(encoded);
    batch.DeleteRange(prefix, PrefixEnd(prefix));
    if (absl::Status status = Write(batch, /*deleting=*/true); !status.ok()) return status;
    --(current->sealed ? sealed_records_ : open_records_);
    stored_bytes_ -= current->stored_bytes;
    ++outcome.records;
    outcome.bytes += current->stored_bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<DeleteOutcome> RouteStore::DeleteJob(absl::string_view job_id, int64_t version_begin,
                                                    int64_t version_end) {
  absl::StatusOr<std::vector<RecordInfo>> records = ListJob(job_id, version_begin, version_end);
  if (!records.ok()) return records.status();
  DeleteOutcome outcome;
  const auto any = [](const RecordInfo&) { return true; };
  if (absl::Status status = DeleteRecords(*records, any, outcome); !status.ok()) return status;
  return outcome;
}

absl::StatusOr<DeleteOutcome> RouteStore::DeleteUpdatedBefore(absl::Time cutoff) {
  const auto is_expired = [cutoff](const RecordInfo& record) { return record.updated < cutoff; };
  std::vector<RecordInfo> expired;
  absl::Status status = ScanRecords(*db_, std::string(1, kMetaSpace),
                                    std::string(1, kMetaSpace + 1), [&](RecordInfo record) {
                                      if (is_expired(record)) expired.push_back(std::move(record));
                                      return absl::OkStatus();
                                    });
  if (!status.ok()) return status;
  DeleteOutcome outcome;
  // Re-checked under each record's lock: an append since the scan keeps the record alive.
  if (status = DeleteRecords(expired, is_expired, outcome); !status.ok()) return status;
  return outcome;
}

StoreTotals RouteStore::totals() const {
  return {.open_records = open_records_.load(),
          .sealed_records = sealed_records_.load(),
          .stored_bytes = stored_bytes_.load()};
}

}  // namespace tandem::router_replay
