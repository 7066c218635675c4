#ifndef TANDEM_COMMON_ERRNO_STATUS_H_
#define TANDEM_COMMON_ERRNO_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The status of a failed file operation from the current errno, "<what> <path>: <strerror>",
// with absl::ErrnoToStatus's code: a full disk (ENOSPC, EDQUOT) is RESOURCE_EXHAUSTED in every
// service, a missing file NOT_FOUND, a permission PERMISSION_DENIED.
absl::Status ErrnoStatus(absl::string_view what, const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_ERRNO_STATUS_H_
