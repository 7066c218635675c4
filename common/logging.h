#ifndef TANDEM_COMMON_LOGGING_H_
#define TANDEM_COMMON_LOGGING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// Debian's Abseil has its own string_view type, which fmt does not know; let spdlog format
// it, and absl::Status, directly.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  auto format(absl::string_view text, fmt::format_context& context) const {
    return fmt::formatter<fmt::string_view>::format({text.data(), text.size()}, context);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  auto format(const absl::Status& status, fmt::format_context& context) const {
    const std::string text = status.ToString();
    return fmt::formatter<fmt::string_view>::format({text.data(), text.size()}, context);
  }
};

namespace tandem {

// Configures the process-wide spdlog logger from --log_level: stderr, millisecond timestamps,
// thread id and the program name, so the interleaved logs of the four services stay readable.
// Returns INVALID_ARGUMENT for an unknown level.
absl::Status InitLogging(absl::string_view program_name);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOGGING_H_
