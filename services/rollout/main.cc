#include <memory>
#include <vector>

#include "common/service_main.h"
#include "services/rollout/rollout_service.h"

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "rollout",
       .usage = "Tandem rollout service. Generation with routing capture and adapter hot-swap "
                "(issue #6).",
       .defaults = {.port = 50052, .metrics_port = 9452, .max_message_bytes = 64 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         std::vector<tandem::HostedService> services;
         services.push_back(
             {"tandem.v1.RolloutService", std::make_unique<tandem::rollout::RolloutServiceImpl>()});
         return services;
       }});
}
