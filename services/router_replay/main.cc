#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/service_main.h"
#include "common/status.h"
#include "services/router_replay/router_replay_service.h"

ABSL_FLAG(std::string, data_dir, "router-replay-data",
          "Directory of the route database (created if missing).");
ABSL_FLAG(std::string, fsync, "ack",
          "When appended routes reach stable storage: 'ack' (once per Append stream or Seal, "
          "before replying: durable acknowledgements), 'always' (every chunk) or 'never' "
          "(survives a process crash, not a machine crash).");
ABSL_FLAG(std::string, wal_recovery, "refuse",
          "A damaged route log at start: 'refuse' to start (acknowledged records are never "
          "dropped silently) or 'point_in_time' (keep what precedes the damage, drop the rest).");
ABSL_FLAG(int, max_fetch_streams, 32,
          "FetchRoutes streams served at once; one more is RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, fetch_write_timeout, absl::Minutes(1),
          "A FetchRoutes stream whose client reads nothing for this long is cancelled.");
ABSL_FLAG(int, zstd_level, 1, "zstd level for route blocks; 0 stores bit-packed ids only.");
ABSL_FLAG(absl::Duration, retention_ttl, absl::Hours(72),
          "Records untouched for this long are deleted; 0 keeps them until DeleteRecords.");
ABSL_FLAG(int64_t, write_buffer_mib, 64,
          "Memory for not-yet-flushed writes; beyond it routes spill to disk.");
ABSL_FLAG(int64_t, block_cache_mib, 64, "Memory caching stored route blocks for fetches.");

namespace {

absl::StatusOr<tandem::router_replay::RouterReplayOptions> OptionsFromFlags() {
  tandem::router_replay::RouterReplayOptions options;
  absl::StatusOr<tandem::router_replay::SyncPolicy> sync =
      tandem::router_replay::ParseSyncPolicy(absl::GetFlag(FLAGS_fsync));
  if (!sync.ok()) return sync.status();
  const int zstd_level = absl::GetFlag(FLAGS_zstd_level);
  if (zstd_level < 0 || zstd_level > 19) {
    return tandem::InvalidRequest("INVALID_FLAG",
                                  absl::StrCat("--zstd_level is ", zstd_level, "; allowed 0..19"));
  }
  const absl::Duration ttl = absl::GetFlag(FLAGS_retention_ttl);
  if (ttl < absl::ZeroDuration()) {
    return tandem::InvalidRequest("INVALID_FLAG", "--retention_ttl must be >= 0");
  }
  const int64_t write_buffer_mib = absl::GetFlag(FLAGS_write_buffer_mib);
  const int64_t block_cache_mib = absl::GetFlag(FLAGS_block_cache_mib);
  if (write_buffer_mib < 1 || block_cache_mib < 1) {
    return tandem::InvalidRequest("INVALID_FLAG",
                                  "--write_buffer_mib and --block_cache_mib must be >= 1");
  }
  auto wal_recovery = tandem::router_replay::ParseWalRecovery(absl::GetFlag(FLAGS_wal_recovery));
  if (!wal_recovery.ok()) return wal_recovery.status();
  options.store = {.path = absl::GetFlag(FLAGS_data_dir),
                   .sync = *sync,
                   .zstd_level = zstd_level,
                   .write_buffer_bytes = write_buffer_mib << 20,
                   .block_cache_bytes = block_cache_mib << 20,
                   .wal_recovery = *wal_recovery};
  options.retention_ttl = ttl;
  options.max_fetch_streams = absl::GetFlag(FLAGS_max_fetch_streams);
  options.fetch_write_timeout = absl::GetFlag(FLAGS_fetch_write_timeout);
  options.sweep_interval = std::clamp(ttl / 10, absl::Seconds(1), absl::Minutes(10));
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "router-replay",
       .usage = "Tandem router-replay service: durable per-token MoE routing records for "
                "replay in training (R3), expert-load statistics and placement plans.",
       .defaults = {.port = 50054, .metrics_port = 9454, .max_message_bytes = 8 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         absl::StatusOr<tandem::router_replay::RouterReplayOptions> options = OptionsFromFlags();
         if (!options.ok()) return options.status();
         absl::StatusOr<std::unique_ptr<tandem::router_replay::RouterReplayServiceImpl>> service =
             tandem::router_replay::RouterReplayServiceImpl::Create(*options);
         if (!service.ok()) return service.status();
         std::vector<tandem::HostedService> services;
         services.push_back({"tandem.routerreplay.v1.RouterReplayService", *std::move(service)});
         return services;
       }});
}
