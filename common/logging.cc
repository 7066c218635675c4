#include "common/logging.h"

#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/sinks/stdout_color_sinks.h"

ABSL_FLAG(std::string, log_level, "info",
          "Minimum log level: trace, debug, info, warn, error or critical.");

namespace tandem {

absl::Status InitLogging(absl::string_view program_name) {
  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  // from_str maps every unknown name to "off"; only the literal "off" may mean that.
  if (level == spdlog::level::off && level_name != "off") {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("--log_level=", level_name,
                                       " is not one of trace, debug, info, warn, error, critical"));
  }
  auto logger = std::make_shared<spdlog::logger>(
      std::string(program_name), std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n[%t] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace tandem
