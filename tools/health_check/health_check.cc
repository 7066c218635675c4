// Asks a Tandem service whether it is SERVING, using the standard gRPC health protocol.
// Exit status 0 when it is, 1 otherwise; `./tandem demo` and deployment scripts use it, and the
// Helm chart's probes when TLS is on (the kubelet's own gRPC probe speaks plaintext only).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/health_client.h"
#include "common/peer_tls.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "host:port of the service.");
ABSL_FLAG(std::string, service, "",
          "Full proto service name; empty asks whether the server is ready, 'liveness' whether "
          "it answers at all.");
ABSL_FLAG(absl::Duration, wait, absl::Seconds(2),
          "Keep asking until SERVING or this much time has passed.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Reports whether a Tandem service is SERVING.");
  absl::ParseCommandLine(argc, argv);
  // Health is exempt from auth, so no token is needed.
  const std::string service = absl::GetFlag(FLAGS_service);
  auto tls = tandem::PeerTlsFromFlags();  // --peer_tls_*: the server speaks TLS.
  if (!tls.ok()) {
    std::fprintf(stderr, "health_check: %s\n", tls.status().ToString().c_str());
    return 2;
  }
  const absl::Status status = tandem::WaitUntilServing(
      {.target = absl::GetFlag(FLAGS_target), .tls = *std::move(tls)}, service,
      absl::GetFlag(FLAGS_wait));
  if (!status.ok()) {
    std::fprintf(stderr, "health_check: %s at %s: %s\n",
                 service.empty() ? "server" : service.c_str(), absl::GetFlag(FLAGS_target).c_str(),
                 status.ToString().c_str());
    return 1;
  }
  std::printf("%s at %s: SERVING\n", service.empty() ? "server" : service.c_str(),
              absl::GetFlag(FLAGS_target).c_str());
  return 0;
}
