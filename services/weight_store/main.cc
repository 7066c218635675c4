#include <memory>
#include <vector>

#include "common/service_main.h"
#include "services/weight_store/weight_store_service.h"

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "weight-store",
       .usage = "Tandem weight-store service. Versioned LoRA adapters moved by UCX, resharded per "
                "consumer (issue #5).",
       .defaults = {.port = 50053, .metrics_port = 9453, .max_message_bytes = 80 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         std::vector<tandem::HostedService> services;
         services.push_back({"tandem.v1.WeightStoreService",
                             std::make_unique<tandem::weight_store::WeightStoreServiceImpl>()});
         return services;
       }});
}
