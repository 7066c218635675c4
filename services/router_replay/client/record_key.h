#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_RECORD_KEY_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_RECORD_KEY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::router_replay {

// Identifies one routing record: (job, policy version, sample, attempt). A retried sample gets a
// new attempt, so attempts never overwrite each other.
struct RecordKey {
  std::string job_id;
  int64_t policy_version = 0;
  std::string sample_id;
  int32_t attempt = 0;

  friend bool operator==(const RecordKey&, const RecordKey&) = default;
};

// INVALID_ARGUMENT naming the bad field unless every field follows the API's rules
// (identifiers of 1-128 bytes from [A-Za-z0-9._:/-], version and attempt >= 0). `path` is the
// key's field path from the request root (e.g. "key", "records.records[3].key"): the error's
// google.rpc.BadRequest names `path`.job_id and so on, its message the key's own field.
absl::Status ValidateRecordKey(const RecordKey& key, absl::string_view path = "key");
// The same for a job id at `path` (e.g. "job_id", "job.job_id").
absl::Status ValidateJobId(absl::string_view job_id, absl::string_view path = "job_id");

// "job/v3/sample-7#1", for messages.
std::string ToString(const RecordKey& key);

// Order-preserving storage encoding: job_id \0 version(be64) sample_id \0 attempt(be32).
// Identifiers never contain \0, so sorting the encodings sorts by (job, version, sample,
// attempt) and every record of a job, or of a job's version range, is one key range.
std::string EncodeRecordKey(const RecordKey& key);
absl::StatusOr<RecordKey> DecodeRecordKey(absl::string_view encoded);
// The first encoded key of (job_id, version) and beyond: [JobVersionPrefix(j, a),
// JobVersionPrefix(j, b)) holds exactly the records of job j with versions in [a, b).
std::string JobVersionPrefix(absl::string_view job_id, int64_t policy_version);
// The key range of all of a job's records: [JobPrefix, JobPrefixEnd).
std::string JobPrefix(absl::string_view job_id);
std::string JobPrefixEnd(absl::string_view job_id);

// The data-parallel rank a sample belongs to: XXH3_64bits(sample_id) % dp_size, so every
// sample reaches exactly one rank whatever each rank asks for.
int32_t DataParallelRank(absl::string_view sample_id, int32_t dp_size);

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_RECORD_KEY_H_
