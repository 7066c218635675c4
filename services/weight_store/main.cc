#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/service_main.h"
#include "common/status.h"
#include "services/weight_store/weight_store_service.h"

ABSL_FLAG(std::string, data_dir, "weight-store-data",
          "Directory of committed versions (created if missing; recovered at start).");
ABSL_FLAG(int, keep_versions, 3,
          "Newest committed versions kept per adapter, besides versions under a lease.");
ABSL_FLAG(absl::Duration, upload_expiry, absl::Minutes(15),
          "An upload no call has named for this long is aborted and its memory freed.");
ABSL_FLAG(bool, ucx, true,
          "Serve the UCX data path (one-sided put/get into registered memory); "
          "false: gRPC only.");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports (as UCX_TLS), e.g. 'tcp' or 'posix,sysv,self,tcp'; empty: UCX's "
          "choice ($UCX_TLS wins if set).");

namespace {

absl::StatusOr<tandem::weight_store::WeightStoreOptions> OptionsFromFlags() {
  tandem::weight_store::WeightStoreOptions options;
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.keep_versions = absl::GetFlag(FLAGS_keep_versions);
  if (options.keep_versions < 1) {
    return tandem::InvalidRequest(
        "INVALID_FLAG",
        absl::StrCat("--keep_versions is ", options.keep_versions, "; must be >= 1"));
  }
  options.upload_expiry = absl::GetFlag(FLAGS_upload_expiry);
  if (options.upload_expiry <= absl::ZeroDuration()) {
    return tandem::InvalidRequest("INVALID_FLAG", "--upload_expiry must be positive");
  }
  options.enable_ucx = absl::GetFlag(FLAGS_ucx);
  options.ucx.transports = absl::GetFlag(FLAGS_ucx_transports);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "weight-store",
       .usage = "Tandem weight-store service: versioned LoRA adapters, published and fetched by "
                "UCX or gRPC, resharded into each consumer's layout.",
       .defaults = {.port = 50053, .metrics_port = 9453, .max_message_bytes = 80 << 20},
       .make_services =
           [](const tandem::ServerOptions&) -> absl::StatusOr<std::vector<tandem::HostedService>> {
         absl::StatusOr<tandem::weight_store::WeightStoreOptions> options = OptionsFromFlags();
         if (!options.ok()) return options.status();
         return tandem::weight_store::WeightStoreServices(*options);
       }});
}
