#include <memory>
#include <vector>

#include "common/service_main.h"
#include "services/trainer/job_service.h"

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "trainer",
       .usage = "Tandem trainer service. Job API: create, list, watch and cancel RL jobs; runs "
                "them (issue #7).",
       .defaults = {.port = 50051, .metrics_port = 9451, .max_message_bytes = 16 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         std::vector<tandem::HostedService> services;
         services.push_back(
             {"tandem.v1.JobService", std::make_unique<tandem::trainer::JobServiceImpl>()});
         return services;
       }});
}
