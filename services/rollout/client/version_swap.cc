#include "services/rollout/client/version_swap.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"

namespace tandem::rollout {

absl::Status AwaitVersionServed(absl::Span<const ReplicaStub> replicas, const std::string& adapter,
                                int64_t version, const VersionSwapOptions& options, Clock& clock) {
  const absl::Time deadline = clock.Now() + options.timeout;
  for (const ReplicaStub& replica : replicas) {
    absl::Duration poll = options.poll_initial;
    while (true) {
      rollout::v1::GetAdapterStatusRequest request;
      request.set_adapter_name(adapter);
      rollout::v1::GetAdapterStatusResponse response;
      grpc::ClientContext context;
      SetTimeout(context, options.rpc_timeout);
      const absl::Status status =
          FromGrpcStatus(replica.stub->GetAdapterStatus(&context, request, &response));
      if (absl::IsNotFound(status) || absl::IsUnavailable(status)) break;
      if (!status.ok()) return status;
      if (response.adapters(0).current_version() >= version) break;
      if (clock.Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rollout ", replica.address, " did not serve version ", version,
                         " within ", absl::FormatDuration(options.timeout),
                         "; last error: ", response.adapters(0).last_error()));
      }
      clock.SleepFor(poll);
      poll = std::min(poll * 2, options.poll_max);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::rollout
