#include "common/watched_files.h"

#include <sys/stat.h>

#include <utility>

#include "common/server_options.h"
#include "spdlog/spdlog.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<WatchedFiles>> WatchedFiles::Open(std::vector<std::string> paths,
                                                                 absl::Duration interval) {
  std::unique_ptr<WatchedFiles> files(new WatchedFiles(std::move(paths), interval));
  absl::MutexLock lock(&files->mutex_);
  if (!files->RefreshLocked()) {
    for (const std::string& path : files->paths_) {
      if (absl::StatusOr<std::string> read = ReadSmallFile(path); !read.ok()) return read.status();
    }
  }
  files->generation_ = 0;
  return files;
}

std::vector<std::string> WatchedFiles::Contents() {
  absl::MutexLock lock(&mutex_);
  RefreshLocked();
  return contents_;
}

int64_t WatchedFiles::generation() {
  absl::MutexLock lock(&mutex_);
  RefreshLocked();
  return generation_;
}

bool WatchedFiles::RefreshLocked() {
  const absl::Time now = absl::Now();
  if (now - last_look_ < interval_) return true;
  last_look_ = now;
  std::vector<Signature> signatures;
  for (const std::string& path : paths_) {
    struct stat status {};
    if (stat(path.c_str(), &status) != 0) return false;
    signatures.push_back(
        {.inode = status.st_ino,
         .size = status.st_size,
         .mtime_ns = status.st_mtim.tv_sec * 1'000'000'000 + status.st_mtim.tv_nsec});
  }
  if (signatures == signatures_) return true;
  std::vector<std::string> contents;
  for (const std::string& path : paths_) {
    absl::StatusOr<std::string> read = ReadSmallFile(path);
    if (!read.ok()) {
      spdlog::warn("{} changed but cannot be read yet ({}); keeping its last contents", path,
                   std::string(read.status().message()));
      return false;
    }
    contents.push_back(*std::move(read));
  }
  signatures_ = std::move(signatures);
  contents_ = std::move(contents);
  ++generation_;
  return true;
}

}  // namespace tandem
