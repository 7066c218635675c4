#ifndef TANDEM_COMMON_WATCHED_FILES_H_
#define TANDEM_COMMON_WATCHED_FILES_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// A set of files read again whenever one of them changes on disk -- as a mounted Kubernetes
// Secret does when it is renewed (its files are swapped together, by a symlink). A change is
// seen by each file's inode, size and modification time, checked at most once per `interval`,
// so callers may ask on every handshake or call. Thread-safe.
//
// A file rewritten in place is never taken half-written: a change is read only once it has
// settled (every file last modified at least `interval` ago, or unchanged since the previous
// look), and the read is kept only if no file changed while it was read. Renaming a complete
// file into place (what Kubernetes does) is still the way to rotate: it is never seen partial.
class WatchedFiles {
 public:
  // Reads every file once: an error names the first one that cannot be read.
  static absl::StatusOr<std::unique_ptr<WatchedFiles>> Open(std::vector<std::string> paths,
                                                            absl::Duration interval);

  // The contents, in path order, re-read if a file changed. A file that cannot be read (a
  // Secret being swapped) leaves the last contents in place until it can.
  std::vector<std::string> Contents();
  // How many times the contents changed since Open; callers compare it to what they last saw.
  int64_t generation();

 private:
  struct Signature {
    uint64_t inode = 0;
    int64_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const Signature&) const = default;
  };

  WatchedFiles(std::vector<std::string> paths, absl::Duration interval)
      : paths_(std::move(paths)), interval_(interval) {}
  // Each file's signature; nullopt when one cannot be stat'ed.
  std::optional<std::vector<Signature>> Stat() const;
  // Whether the change to `signatures`, seen at `now`, is done being written.
  bool SettledLocked(const std::vector<Signature>& signatures, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Re-reads the files if their signatures changed, the change settled (unless `at_open`) and
  // `interval_` has passed since the last look; returns whether every file could be read when
  // it looked.
  bool RefreshLocked(bool at_open = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::vector<std::string> paths_;
  const absl::Duration interval_;
  absl::Mutex mutex_;
  absl::Time last_look_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  std::vector<Signature> signatures_ ABSL_GUARDED_BY(mutex_);
  std::vector<Signature> unsettled_ ABSL_GUARDED_BY(mutex_);  // A change seen, not yet read.
  std::vector<std::string> contents_ ABSL_GUARDED_BY(mutex_);
  int64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_WATCHED_FILES_H_
