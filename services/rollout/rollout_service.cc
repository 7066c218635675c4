#include "services/rollout/rollout_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/call_tracker.h"
#include "common/finished_reactor.h"
#include "common/logging.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/unary.h"
#include "services/rollout/adapter_status_watch.h"
#include "services/rollout/generate_request.h"
#include "services/rollout/output_processor.h"

namespace tandem::rollout {
namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// Streams a request's samples as the scheduler finishes them, then ends OK after the last.
class GenerateReactor final : public QueuedWriteReactor<rollout::v1::GenerateResponse> {
 public:
  GenerateReactor(grpc::CallbackServerContext* context, Scheduler& scheduler, CallTracker& streams,
                  std::unique_ptr<GenerationWork> work)
      : scheduler_(scheduler), stream_(streams), expected_(work->num_samples()) {
    work->start = absl::Now();
    work->deadline = DeadlineOf(*context);
    // The work owns this function: it is alive whenever the function runs.
    work->deliver = [sink = sink(), of = work.get()](SampleOutput output) {
      sink->Write(ToGenerateResponse(*of, output));
    };
    work->fail = [sink = sink()](const absl::Status& status) {
      sink->Finish(ToGrpcStatus(status));
    };
    work_ = std::move(work);
    absl::Duration retry_after;
    if (absl::Status status = scheduler_.Submit(work_, &retry_after); !status.ok()) {
      if (absl::IsResourceExhausted(status)) {
        // gRPC's own retry pushback: clients with a retry policy wait this long.
        context->AddTrailingMetadata("grpc-retry-pushback-ms",
                                     absl::StrCat(absl::ToInt64Milliseconds(retry_after)));
      }
      sink()->Finish(ToGrpcStatus(status));
    }
  }

 private:
  bool IsLast(const rollout::v1::GenerateResponse& /*response*/) override {
    return ++written_ == expected_;
  }

  // The scheduler drops the request's samples and frees their KV cache.
  void OnClientGone() override {
    work_->cancelled = true;
    scheduler_.Wake();
  }

  Scheduler& scheduler_;
  const CallTracker::Token stream_;  // Until the reactor is done.
  const int expected_;
  int written_ = 0;
  std::shared_ptr<GenerationWork> work_;
};

}  // namespace

void RolloutServiceImpl::Drain() {
  replica_->Drain();
  const RolloutOptions& options = replica_->options();
  if (!streams_.WaitUntilIdle(options.drain_wait)) {
    spdlog::warn("rollout drain: Generate streams still open after {}",
                 absl::FormatDuration(options.drain_wait));
  }
  // A connection closed right after a stream's last response can reach the client as a reset
  // that discards responses it had not read yet.
  absl::SleepFor(options.drain_linger);
}

grpc::ServerWriteReactor<rollout::v1::GenerateResponse>* RolloutServiceImpl::Generate(
    grpc::CallbackServerContext* context, const rollout::v1::GenerateRequest* request) {
  // Health says NOT_SERVING until then; a client that calls anyway must not get samples of
  // stale weights, nor wait on a load that may never come.
  if (!Ready()) {
    return new FinishedReactor<grpc::ServerWriteReactor<rollout::v1::GenerateResponse>>(
        grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            "rollout replica is not yet serving current weights (its --adapter versions are still "
            "loading); retry later"));
  }
  absl::StatusOr<std::unique_ptr<GenerationWork>> work =
      PrepareWork(*request, replica_->model_config(), replica_->codec());
  if (!work.ok()) {
    return new FinishedReactor<grpc::ServerWriteReactor<rollout::v1::GenerateResponse>>(
        ToGrpcStatus(work.status()));
  }
  return new GenerateReactor(context, replica_->scheduler(), streams_, *std::move(work));
}

grpc::ServerUnaryReactor* RolloutServiceImpl::GetAdapterStatus(
    grpc::CallbackServerContext* context, const rollout::v1::GetAdapterStatusRequest* request,
    rollout::v1::GetAdapterStatusResponse* response) {
  absl::StatusOr<std::vector<rollout::v1::AdapterStatus>> adapters =
      replica_->registry().Status(request->adapter_name());
  if (!adapters.ok()) {
    return FinishUnary<rollout::v1::GetAdapterStatusResponse>(context, adapters.status(), response);
  }
  rollout::v1::GetAdapterStatusResponse result;
  result.set_replica_id(replica_->id());
  result.mutable_adapters()->Add(adapters->begin(), adapters->end());
  return FinishUnary<rollout::v1::GetAdapterStatusResponse>(context, std::move(result), response);
}

grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>*
RolloutServiceImpl::WatchAdapterStatus(grpc::CallbackServerContext* /*context*/,
                                       const rollout::v1::WatchAdapterStatusRequest* request) {
  using Finished =
      FinishedReactor<grpc::ServerWriteReactor<rollout::v1::WatchAdapterStatusResponse>>;
  if (request->adapter_name().empty()) {
    return new Finished(ToGrpcStatus(
        InvalidField("adapter_name", "adapter_name is required: the adapter to watch")));
  }
  if (absl::Status followed = replica_->registry().Status(request->adapter_name()).status();
      !followed.ok()) {
    return new Finished(ToGrpcStatus(followed));
  }
  return new AdapterStatusWatch(replica_->registry(), request->adapter_name(), replica_->id());
}

std::vector<HostedService> RolloutServices(std::unique_ptr<RolloutReplica> replica) {
  weight_store::RelayedVersions* relayed = replica->relayed();
  auto rollout = std::make_unique<RolloutServiceImpl>(std::move(replica));
  RolloutServiceImpl* raw = rollout.get();
  std::vector<HostedService> services;
  services.push_back({"tandem.rollout.v1.RolloutService", std::move(rollout),
                      [raw] { return raw->Ready(); }, [raw] { raw->Drain(); }});
  if (relayed != nullptr) {
    // A replica downstream asks as soon as it hears of a version, which may be before this one
    // does: the wait covers a slow watch or a busy loader, after which it reads from the store.
    services.push_back(
        {"tandem.internal.v1.AdapterRelayService",
         std::make_unique<weight_store::AdapterRelayServiceImpl>(*relayed, absl::Seconds(10))});
  }
  return services;
}

}  // namespace tandem::rollout
