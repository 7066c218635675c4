#include "services/router_replay/client/record_key.h"

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/identifier.h"
#include "common/status.h"
#include "xxhash.h"

namespace tandem::router_replay {
namespace {

void AppendBigEndian64(std::string& out, uint64_t value) {
  char bytes[8];
  absl::big_endian::Store64(bytes, value);
  out.append(bytes, sizeof(bytes));
}

void AppendBigEndian32(std::string& out, uint32_t value) {
  char bytes[4];
  absl::big_endian::Store32(bytes, value);
  out.append(bytes, sizeof(bytes));
}

// ValidateIdentifier's error for the field `name`, naming the field at `path` in its details.
absl::Status CheckIdentifier(absl::string_view path, absl::string_view name,
                             absl::string_view value) {
  if (IsIdentifier(value)) return absl::OkStatus();
  return InvalidField(path, ValidateIdentifier(name, value).message());
}

}  // namespace

absl::Status ValidateJobId(absl::string_view job_id, absl::string_view path) {
  return CheckIdentifier(path, "job_id", job_id);
}

absl::Status ValidateRecordKey(const RecordKey& key, absl::string_view path) {
  if (absl::Status status = CheckIdentifier(FieldPath(path, "job_id"), "job_id", key.job_id);
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckIdentifier(FieldPath(path, "sample_id"), "sample_id", key.sample_id);
      !status.ok()) {
    return status;
  }
  if (key.policy_version < 0) {
    return InvalidField(
        FieldPath(path, "policy_version"),
        absl::StrCat("bad policy_version: ", key.policy_version, " (must be >= 0)"));
  }
  if (key.attempt < 0) {
    return InvalidField(FieldPath(path, "attempt"),
                        absl::StrCat("bad attempt: ", key.attempt, " (must be >= 0)"));
  }
  return absl::OkStatus();
}

std::string ToString(const RecordKey& key) {
  return absl::StrCat(key.job_id, "/v", key.policy_version, "/", key.sample_id, "#", key.attempt);
}

std::string JobVersionPrefix(absl::string_view job_id, int64_t policy_version) {
  std::string out = JobPrefix(job_id);
  AppendBigEndian64(out, static_cast<uint64_t>(policy_version));
  return out;
}

std::string JobPrefix(absl::string_view job_id) {
  return absl::StrCat(job_id, absl::string_view("\0", 1));
}

std::string JobPrefixEnd(absl::string_view job_id) {
  return absl::StrCat(job_id, absl::string_view("\1", 1));
}

std::string EncodeRecordKey(const RecordKey& key) {
  std::string out = JobVersionPrefix(key.job_id, key.policy_version);
  out.append(key.sample_id);
  out.push_back('\0');
  AppendBigEndian32(out, static_cast<uint32_t>(key.attempt));
  return out;
}

absl::StatusOr<RecordKey> DecodeRecordKey(absl::string_view encoded) {
  const auto corrupt = [&] {
    return absl::DataLossError(
        absl::StrCat("corrupt stored record key of ", encoded.size(), " bytes"));
  };
  RecordKey key;
  const size_t job_end = encoded.find('\0');
  if (job_end == absl::string_view::npos || encoded.size() < job_end + 1 + 8 + 1 + 4) {
    return corrupt();
  }
  key.job_id = std::string(encoded.substr(0, job_end));
  key.policy_version = static_cast<int64_t>(absl::big_endian::Load64(encoded.data() + job_end + 1));
  const absl::string_view rest = encoded.substr(job_end + 1 + 8);
  const size_t sample_end = rest.find('\0');
  if (sample_end == absl::string_view::npos || rest.size() != sample_end + 1 + 4) return corrupt();
  key.sample_id = std::string(rest.substr(0, sample_end));
  key.attempt = static_cast<int32_t>(absl::big_endian::Load32(rest.data() + sample_end + 1));
  return key;
}

int32_t DataParallelRank(absl::string_view sample_id, int32_t dp_size) {
  if (dp_size <= 1) return 0;
  return static_cast<int32_t>(XXH3_64bits(sample_id.data(), sample_id.size()) %
                              static_cast<uint64_t>(dp_size));
}

}  // namespace tandem::router_replay
