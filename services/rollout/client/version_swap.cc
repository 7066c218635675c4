#include "services/rollout/client/version_swap.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"

namespace tandem::rollout {
namespace {

constexpr absl::Duration kLastLook = absl::Seconds(1);

absl::Status NotServedInTime(const ReplicaStub& replica, int64_t version,
                             const VersionSwapOptions& options, const std::string& last_error) {
  return absl::DeadlineExceededError(
      absl::StrCat("rollout ", replica.address, " did not serve version ", version, " within ",
                   absl::FormatDuration(options.timeout), "; last error: ", last_error));
}

// Whether a replica's answer means it is not to be waited for: it does not follow the adapter
// (NOT_FOUND) or is restarting (UNAVAILABLE); either loads the version on first use.
bool NotWaitedFor(const absl::Status& status) {
  return absl::IsNotFound(status) || absl::IsUnavailable(status);
}

// Reads `replica`'s WatchAdapterStatus stream until it serves `version`. UNIMPLEMENTED from a
// replica that predates the watch.
absl::Status WatchUntilServed(const ReplicaStub& replica, const std::string& adapter,
                              int64_t version, const VersionSwapOptions& options,
                              absl::Duration remaining) {
  rollout::v1::WatchAdapterStatusRequest request;
  request.set_adapter_name(adapter);
  grpc::ClientContext context;
  SetTimeout(context, remaining);
  std::unique_ptr<grpc::ClientReaderInterface<rollout::v1::WatchAdapterStatusResponse>> stream =
      replica.stub->WatchAdapterStatus(&context, request);
  rollout::v1::WatchAdapterStatusResponse response;
  std::string last_error;
  while (stream->Read(&response)) {
    if (response.status().current_version() >= version) {
      context.TryCancel();
      stream->Finish();  // CANCELLED, by us.
      return absl::OkStatus();
    }
    last_error = response.status().last_error();
  }
  const absl::Status status = FromGrpcStatus(stream->Finish());
  if (NotWaitedFor(status)) return absl::OkStatus();
  if (absl::IsDeadlineExceeded(status)) {
    return NotServedInTime(replica, version, options, last_error);
  }
  if (status.ok()) {
    return absl::InternalError(absl::StrCat("rollout ", replica.address,
                                            " ended its adapter status stream before serving "
                                            "version ",
                                            version));
  }
  return status;
}

// Asks `replica` with GetAdapterStatus, with doubling pauses, until it serves `version`.
absl::Status PollUntilServed(const ReplicaStub& replica, const std::string& adapter,
                             int64_t version, const VersionSwapOptions& options,
                             absl::Time deadline, Clock& clock) {
  absl::Duration poll = options.poll_initial;
  while (true) {
    rollout::v1::GetAdapterStatusRequest request;
    request.set_adapter_name(adapter);
    rollout::v1::GetAdapterStatusResponse response;
    grpc::ClientContext context;
    SetTimeout(context, options.rpc_timeout);
    const absl::Status status =
        FromGrpcStatus(replica.stub->GetAdapterStatus(&context, request, &response));
    if (NotWaitedFor(status)) return absl::OkStatus();
    if (!status.ok()) return status;
    if (response.adapters(0).current_version() >= version) return absl::OkStatus();
    if (clock.Now() > deadline) {
      return NotServedInTime(replica, version, options, response.adapters(0).last_error());
    }
    clock.SleepFor(poll);
    poll = std::min(poll * 2, options.poll_max);
  }
}

}  // namespace

absl::Status AwaitVersionServed(absl::Span<const ReplicaStub> replicas, const std::string& adapter,
                                int64_t version, const VersionSwapOptions& options, Clock& clock) {
  const absl::Time deadline = clock.Now() + options.timeout;
  for (const ReplicaStub& replica : replicas) {
    // Replicas that took the whole timeout before leave the others time for one status each.
    absl::Status status = WatchUntilServed(replica, adapter, version, options,
                                           std::max(deadline - clock.Now(), kLastLook));
    if (absl::IsUnimplemented(status)) {
      status = PollUntilServed(replica, adapter, version, options, deadline, clock);
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace tandem::rollout
