#include "services/trainer/api/job_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/checksummed_message.h"
#include "common/errno_status.h"
#include "common/logging.h"
#include "common/proto_time.h"

namespace tandem::trainer {
namespace {

constexpr absl::string_view kMagic = "TJOB";  // See EncodeChecksummed.

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags);
  if (fd < 0) return ErrnoStatus("open", path);
  const int result = fsync(fd);
  close(fd);
  return result == 0 ? absl::OkStatus() : ErrnoStatus("fsync", path);
}

// Moves a damaged record aside and stands in a FAILED job of its id, so clients see what
// happened instead of the trainer refusing to start.
absl::StatusOr<trainer::v1::Job> Quarantine(const std::string& path, const std::string& job_id,
                                            const absl::Status& problem) {
  const std::string aside = path + ".corrupt";
  std::error_code error;
  std::filesystem::rename(path, aside, error);
  if (error) {
    return absl::DataLossError(absl::StrCat("job record ", path, " is corrupt (", problem.message(),
                                            ") and cannot be moved aside: ", error.message()));
  }
  spdlog::error("job record {} is corrupt ({}); moved to {}", path, problem.message(), aside);
  trainer::v1::Job job;
  job.set_id(job_id);
  job.set_state(trainer::v1::JOB_STATE_FAILED);
  job.set_error_message(absl::StrCat("the trainer's record of this job was corrupt (",
                                     problem.message(), ") and is kept at ", aside));
  *job.mutable_update_time() = NowTimestamp();
  *job.mutable_end_time() = job.update_time();
  return job;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  const std::string jobs = dir + "/jobs";
  std::error_code error;
  std::filesystem::create_directories(jobs, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot create ", jobs, ": ", error.message()));
  std::unique_ptr<JobStore> store(new JobStore(jobs));
  for (const auto& entry : std::filesystem::directory_iterator(jobs)) {
    const std::string path = entry.path().string();
    if (!path.ends_with(".binpb")) {
      if (path.ends_with(".tmp")) std::filesystem::remove(path, error);  // A write cut short.
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream contents;
    if (!in || !(contents << in.rdbuf()) || contents.str().empty()) {
      // Unreadable (permissions, I/O) is not corrupt: nothing is quarantined on a bad day.
      return ErrnoStatus("read", path);
    }
    absl::StatusOr<trainer::v1::Job> job = trainer::v1::Job();
    if (absl::Status status = DecodeChecksummed(kMagic, contents.str(), *job); !status.ok()) {
      job = status;
    }
    const std::string id = entry.path().stem().string();
    if (job.ok() && job->id() != id) {
      job = absl::DataLossError(absl::StrCat("holds job ", job->id()));
    }
    if (job.ok()) {
      store->loaded_.push_back(*std::move(job));
    } else {
      absl::StatusOr<trainer::v1::Job> failed = Quarantine(path, id, job.status());
      if (!failed.ok()) return failed.status();
      if (absl::Status status = store->Put(*failed); !status.ok()) return status;
      store->loaded_.push_back(*std::move(failed));
    }
  }
  return store;
}

absl::Status JobStore::Put(const trainer::v1::Job& job) {
  const std::string path = absl::StrCat(dir_, "/", job.id(), ".binpb");
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoStatus("create", temporary);
    const std::string file = EncodeChecksummed(kMagic, job);
    if (!out.write(file.data(), static_cast<std::streamsize>(file.size())) || !out.flush()) {
      return ErrnoStatus("write", temporary);
    }
  }
  if (absl::Status status = SyncPath(temporary, O_RDONLY); !status.ok()) return status;
  if (rename(temporary.c_str(), path.c_str()) != 0) return ErrnoStatus("rename", temporary);
  return SyncPath(dir_, O_RDONLY | O_DIRECTORY);
}

}  // namespace tandem::trainer
