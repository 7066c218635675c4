#include "common/errno_status.h"

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

}  // namespace tandem
