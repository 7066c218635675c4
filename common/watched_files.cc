#include "common/watched_files.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server_options.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

// Reads at Open before a file that keeps changing under them is an error.
constexpr int kOpenAttempts = 3;

}  // namespace

absl::StatusOr<std::unique_ptr<WatchedFiles>> WatchedFiles::Open(std::vector<std::string> paths,
                                                                 absl::Duration interval) {
  std::unique_ptr<WatchedFiles> files(new WatchedFiles(std::move(paths), interval));
  absl::MutexLock lock(&files->mutex_);
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    files->last_look_ = absl::InfinitePast();
    if (files->RefreshLocked(/*at_open=*/true)) {
      files->generation_ = 0;
      return files;
    }
  }
  for (const std::string& path : files->paths_) {
    if (absl::StatusOr<std::string> read = ReadSmallFile(path); !read.ok()) return read.status();
  }
  return absl::UnavailableError(
      absl::StrCat(files->paths_.front(), " kept changing while it was read"));
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

std::optional<std::vector<WatchedFiles::Signature>> WatchedFiles::Stat() const {
  std::vector<Signature> signatures;
  for (const std::string& path : paths_) {
    struct stat status {};
    if (stat(path.c_str(), &status) != 0) return std::nullopt;
    signatures.push_back(
        {.inode = status.st_ino,
         .size = status.st_size,
         .mtime_ns = status.st_mtim.tv_sec * 1'000'000'000 + status.st_mtim.tv_nsec});
  }
  return signatures;
}

bool WatchedFiles::SettledLocked(const std::vector<Signature>& signatures, absl::Time now) {
  const int64_t settled_before_ns = absl::ToUnixNanos(now - interval_);
  bool untouched_for_interval = true;
  for (const Signature& signature : signatures) {
    untouched_for_interval = untouched_for_interval && signature.mtime_ns <= settled_before_ns;
  }
  // Or the same change at the previous look, at least `interval_` ago (a future mtime).
  const bool settled = untouched_for_interval || signatures == unsettled_;
  if (!settled) unsettled_ = signatures;
  return settled;
}

bool WatchedFiles::RefreshLocked(bool at_open) {
  const absl::Time now = absl::Now();
  if (now - last_look_ < interval_) return true;
  last_look_ = now;
  const std::optional<std::vector<Signature>> signatures = Stat();
  if (!signatures.has_value()) return false;
  if (*signatures == signatures_) return true;
  if (!at_open && !SettledLocked(*signatures, now)) return true;
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
  if (Stat() != signatures) {
    spdlog::warn("{} changed while being read; keeping the last contents", paths_.front());
    return false;
  }
  signatures_ = *signatures;
  contents_ = std::move(contents);
  ++generation_;
  return true;
}

}  // namespace tandem
