#ifndef TANDEM_COMMON_TOKEN_FILE_H_
#define TANDEM_COMMON_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/watched_files.h"

namespace tandem {

// The bearer token in a file that is rotated while servers and clients run (a mounted Secret):
// the last valid token the file held. A change to a token CheckAuthToken refuses (empty,
// whitespace only, too short: a file caught truncated or half-written) is logged and ignored,
// so it can never make a server accept an empty token or a client send one. The file is
// watched as WatchedFiles does (at most one look per `interval`, changes read once settled).
// Thread-safe.
class TokenFile {
 public:
  // INVALID_ARGUMENT naming the file when it cannot be read or holds no valid token.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         absl::Duration interval);

  struct Token {
    std::string value;
    int64_t generation = 0;  // How many times a new valid token replaced the one before.
  };
  Token Current();

 private:
  TokenFile(std::string path, std::unique_ptr<WatchedFiles> file, std::string token)
      : path_(std::move(path)), file_(std::move(file)), token_{.value = std::move(token)} {}

  const std::string path_;
  const std::unique_ptr<WatchedFiles> file_;
  absl::Mutex mutex_;
  int64_t file_generation_ ABSL_GUARDED_BY(mutex_) = 0;
  Token token_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKEN_FILE_H_
