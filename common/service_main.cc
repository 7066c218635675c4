#include "common/service_main.h"

#include <cstdio>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/flag_check.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/version.h"

namespace tandem {
namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitCannotServe = 1;

}  // namespace

int RunServiceMain(int argc, char** argv, const ServiceBinary& binary) {
  BlockTerminationSignals();
  absl::SetProgramUsageMessage(binary.usage);
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] { return absl::StrCat("tandem ", kTandemVersion, "\n"); };
  absl::SetFlagsUsageConfig(usage_config);
  // ParseCommandLine would end the process with status 1 on a flag it cannot read.
  if (absl::Status flags = CheckCommandLineFlags(argc, argv); !flags.ok()) {
    std::fprintf(stderr, "%s: %s\n", binary.name.c_str(), std::string(flags.message()).c_str());
    return kExitBadFlags;
  }
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument '%s'; all settings are --flags\n",
                 binary.name.c_str(), positional[1]);
    return kExitBadFlags;
  }
  if (absl::Status logging = InitLogging(binary.name); !logging.ok()) {
    // Without the payloads (the error details), which are for clients, not for people.
    std::fprintf(stderr, "%s: %s\n", binary.name.c_str(),
                 logging.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
    return kExitBadFlags;
  }
  auto options = ServerOptionsFromFlags(binary.defaults);
  if (!options.ok()) {
    spdlog::error("bad flags: {}", options.status().message());
    return kExitBadFlags;
  }
  // /metrics comes up before the services load their model or data, so that a scrape sees a
  // slow start as loading rather than absent. Best effort: a port in use must not hide a bad
  // setting that building the services reports; ServiceServer::Start binds it for good.
  if (ServeMetrics(options->host, options->metrics_port).ok()) {
    RecordBuildInfo(binary.name);
    RecordLoading(binary.name, true);
  }
  auto services = binary.make_services(*options);
  if (!services.ok()) {
    spdlog::error("cannot build services: {}",
                  services.status().ToString(absl::StatusToStringMode::kWithNoExtraData));
    return kExitCannotServe;
  }
  auto server = ServiceServer::Start(binary.name, *std::move(services), *options);
  if (!server.ok()) {
    spdlog::error("{}", server.status());
    return kExitCannotServe;
  }
  (*server)->SetReady();
  const int signal = WaitForTerminationSignal();
  spdlog::info("received signal {}", signal);
  (*server)->Drain();
  return 0;
}

}  // namespace tandem
