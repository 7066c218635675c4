#include <memory>
#include <vector>

#include "common/service_main.h"
#include "services/router_replay/router_replay_service.h"

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "router-replay",
       .usage = "Tandem router-replay service. Per-token routing records, replay fetch, expert "
                "load and placement (issue #4).",
       .defaults = {.port = 50054, .metrics_port = 9454, .max_message_bytes = 8 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         std::vector<tandem::HostedService> services;
         services.push_back({"tandem.v1.RouterReplayService",
                             std::make_unique<tandem::router_replay::RouterReplayServiceImpl>()});
         return services;
       }});
}
