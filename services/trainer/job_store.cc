#include "services/trainer/job_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem::trainer {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags);
  if (fd < 0) return Errno("open", path);
  const int result = fsync(fd);
  close(fd);
  return result == 0 ? absl::OkStatus() : Errno("fsync", path);
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  const std::string jobs = dir + "/jobs";
  std::error_code error;
  std::filesystem::create_directories(jobs, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", jobs, ": ", error.message()));
  std::unique_ptr<JobStore> store(new JobStore(jobs));
  for (const auto& entry : std::filesystem::directory_iterator(jobs)) {
    const std::string path = entry.path().string();
    if (!path.ends_with(".binpb")) {
      if (path.ends_with(".tmp")) std::filesystem::remove(path, error);  // A write cut short.
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    v1::Job job;
    if (!job.ParseFromIstream(&in)) {
      return absl::DataLossError(absl::StrCat("job file ", path, " is corrupt"));
    }
    store->loaded_.push_back(std::move(job));
  }
  return store;
}

absl::Status JobStore::Put(const v1::Job& job) {
  const std::string path = absl::StrCat(dir_, "/", job.id(), ".binpb");
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!job.SerializeToOstream(&out) || !out.flush()) return Errno("write", temporary);
  }
  if (absl::Status status = SyncPath(temporary, O_RDONLY); !status.ok()) return status;
  if (rename(temporary.c_str(), path.c_str()) != 0) return Errno("rename", temporary);
  return SyncPath(dir_, O_RDONLY | O_DIRECTORY);
}

}  // namespace tandem::trainer
