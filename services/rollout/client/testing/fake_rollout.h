#ifndef TANDEM_SERVICES_ROLLOUT_CLIENT_TESTING_FAKE_ROLLOUT_H_
#define TANDEM_SERVICES_ROLLOUT_CLIENT_TESTING_FAKE_ROLLOUT_H_

// A fake rollout replica for the unit tests of rollout's clients (the trainer's job loop, the
// sample fan-out): Generate and GetAdapterStatus through the blocking stub API, with the
// replica's failures (UNAVAILABLE, draining, a failed sample) on demand. Tests that can run the
// real replica use it instead (services/rollout's own tests, tests/).
#include <atomic>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "engine/tokenizer.h"
#include "services/rollout/client/sampling_rules.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"

namespace tandem::rollout::testing {

// A finished server stream: the responses, then the status.
template <typename Response>
class FakeReader final : public grpc::ClientReaderInterface<Response> {
 public:
  FakeReader(std::vector<Response> responses, grpc::Status status)
      : responses_(std::move(responses)), status_(std::move(status)) {}
  bool Read(Response* response) override {
    if (next_ == responses_.size()) return false;
    *response = responses_[next_++];
    return true;
  }
  grpc::Status Finish() override { return status_; }
  bool NextMessageSize(uint32_t* size) override {
    *size = next_ < responses_.size() ? static_cast<uint32_t>(responses_[next_].ByteSizeLong()) : 0;
    return next_ < responses_.size();
  }
  void WaitForInitialMetadata() override {}

 private:
  std::vector<Response> responses_;
  grpc::Status status_;
  size_t next_ = 0;
};

// A rollout replica that answers every sample with "<eos>" (log-prob -1), after failing the
// first `unavailable_calls` calls with UNAVAILABLE or answering them as a draining replica
// does. It serves the newest version published once asked `swap_after_polls` times by
// GetAdapterStatus, or after as many "still loading" statuses on a WatchAdapterStatus stream; a
// replica that never swaps ends its streams DEADLINE_EXCEEDED, as their deadline would. Without
// `watchable` it predates WatchAdapterStatus (UNIMPLEMENTED).
struct FakeRolloutState {
  absl::Mutex mutex;
  int unavailable_calls ABSL_GUARDED_BY(mutex) = 0;
  int draining_calls ABSL_GUARDED_BY(mutex) = 0;
  bool error_sample ABSL_GUARDED_BY(mutex) = false;
  bool nan_logprobs ABSL_GUARDED_BY(mutex) = false;
  bool never_swaps ABSL_GUARDED_BY(mutex) = false;
  int swap_after_polls ABSL_GUARDED_BY(mutex) = 0;
  int polls ABSL_GUARDED_BY(mutex) = 0;
  bool watchable ABSL_GUARDED_BY(mutex) = true;
  int watches ABSL_GUARDED_BY(mutex) = 0;
  std::vector<rollout::v1::GenerateRequest> requests ABSL_GUARDED_BY(mutex);
  int64_t newest_published ABSL_GUARDED_BY(mutex) = 0;  // Told by the test's weight-store watch.
  // Called (without the lock) at the start of each Generate, with the call's number and request.
  std::function<void(int, const rollout::v1::GenerateRequest&)> before_generate;
  std::atomic<int> generate_calls{0};
};

class FakeRolloutStub final : public rollout::v1::RolloutService::StubInterface {
 public:
  explicit FakeRolloutStub(FakeRolloutState& state) : state_(state) {}

  grpc::Status GetAdapterStatus(grpc::ClientContext*,
                                const rollout::v1::GetAdapterStatusRequest& request,
                                rollout::v1::GetAdapterStatusResponse* response) override {
    absl::MutexLock lock(&state_.mutex);
    rollout::v1::AdapterStatus& status = *response->add_adapters();
    status.set_adapter_name(request.adapter_name());
    const bool swapped = !state_.never_swaps && ++state_.polls > state_.swap_after_polls;
    if (swapped) state_.polls = 0;
    status.set_current_version(swapped ? state_.newest_published : 0);
    if (!swapped) status.set_last_error("still loading");
    return grpc::Status::OK;
  }

 private:
  using StatusStream = grpc::ClientReaderInterface<rollout::v1::WatchAdapterStatusResponse>;
  using AsyncStatusStream =
      grpc::ClientAsyncReaderInterface<rollout::v1::WatchAdapterStatusResponse>;

  StatusStream* WatchAdapterStatusRaw(
      grpc::ClientContext*, const rollout::v1::WatchAdapterStatusRequest& request) override {
    using Reader = FakeReader<rollout::v1::WatchAdapterStatusResponse>;
    absl::MutexLock lock(&state_.mutex);
    if (!state_.watchable) {
      return new Reader({}, grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no such method"));
    }
    ++state_.watches;
    std::vector<rollout::v1::WatchAdapterStatusResponse> statuses(state_.swap_after_polls + 1);
    for (rollout::v1::WatchAdapterStatusResponse& message : statuses) {
      message.mutable_status()->set_adapter_name(request.adapter_name());
      message.mutable_status()->set_last_error("still loading");
    }
    if (state_.never_swaps) {
      return new Reader(std::move(statuses),
                        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded"));
    }
    statuses.back().mutable_status()->set_current_version(state_.newest_published);
    statuses.back().mutable_status()->clear_last_error();
    return new Reader(std::move(statuses), grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  AsyncStatusStream* AsyncWatchAdapterStatusRaw(grpc::ClientContext*,
                                                const rollout::v1::WatchAdapterStatusRequest&,
                                                grpc::CompletionQueue*, void*) override {
    return nullptr;
  }
  AsyncStatusStream* PrepareAsyncWatchAdapterStatusRaw(
      grpc::ClientContext*, const rollout::v1::WatchAdapterStatusRequest&,
      grpc::CompletionQueue*) override {
    return nullptr;
  }

  grpc::ClientReaderInterface<rollout::v1::GenerateResponse>* GenerateRaw(
      grpc::ClientContext*, const rollout::v1::GenerateRequest& request) override {
    const int call = ++state_.generate_calls;
    if (state_.before_generate) state_.before_generate(call, request);
    absl::MutexLock lock(&state_.mutex);
    state_.requests.push_back(request);
    if (request.prompts_size() > kMaxPromptsPerRequest) {  // As a replica checks it.
      return new FakeReader<rollout::v1::GenerateResponse>(
          {}, ToGrpcStatus(InvalidField("prompts", "prompts: too many for one request")));
    }
    if (state_.unavailable_calls > 0) {
      --state_.unavailable_calls;
      return new FakeReader<rollout::v1::GenerateResponse>(
          {}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"));
    }
    const bool draining = state_.draining_calls > 0;
    if (draining) --state_.draining_calls;
    std::vector<rollout::v1::GenerateResponse> responses;
    for (int p = 0; p < request.prompts_size(); ++p) {
      for (int s = 0; s < request.group_size(); ++s) {
        rollout::v1::GenerateResponse& response = responses.emplace_back();
        response.set_request_id(request.request_id());
        response.set_prompt_index(p);
        response.set_sample_index(s);
        response.add_token_ids(engine::kEosId);
        response.add_logprobs(state_.nan_logprobs ? std::nanf("") : -1.0f);
        response.set_adapter_version(request.adapter().exact_version());
        if (request.allow_version_switch()) {
          // As a partial rollout does: a second token from the newest version published by
          // then (the first is always the prefill's).
          response.add_token_ids(engine::kEosId);
          response.add_logprobs(-1.0f);
          response.add_token_adapter_versions(request.adapter().exact_version());
          response.add_token_adapter_versions(
              std::max(request.adapter().exact_version(), state_.newest_published));
        }
        response.set_finish_reason(draining ? rollout::v1::FINISH_REASON_CANCELLED
                                            : rollout::v1::FINISH_REASON_STOP);
      }
    }
    if (state_.error_sample) {
      responses.back().set_finish_reason(rollout::v1::FINISH_REASON_ERROR);
      responses.back().set_error_message("kernel fault");
    }
    return new FakeReader<rollout::v1::GenerateResponse>(std::move(responses), grpc::Status::OK);
  }
  grpc::ClientAsyncReaderInterface<rollout::v1::GenerateResponse>* AsyncGenerateRaw(
      grpc::ClientContext*, const rollout::v1::GenerateRequest&, grpc::CompletionQueue*,
      void*) override {
    return nullptr;  // The job loop uses the blocking API only.
  }
  grpc::ClientAsyncReaderInterface<rollout::v1::GenerateResponse>* PrepareAsyncGenerateRaw(
      grpc::ClientContext*, const rollout::v1::GenerateRequest&, grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncResponseReaderInterface<rollout::v1::GetAdapterStatusResponse>*
  AsyncGetAdapterStatusRaw(grpc::ClientContext*, const rollout::v1::GetAdapterStatusRequest&,
                           grpc::CompletionQueue*) override {
    return nullptr;
  }
  grpc::ClientAsyncResponseReaderInterface<rollout::v1::GetAdapterStatusResponse>*
  PrepareAsyncGetAdapterStatusRaw(grpc::ClientContext*, const rollout::v1::GetAdapterStatusRequest&,
                                  grpc::CompletionQueue*) override {
    return nullptr;
  }

  FakeRolloutState& state_;
};

}  // namespace tandem::rollout::testing

#endif  // TANDEM_SERVICES_ROLLOUT_CLIENT_TESTING_FAKE_ROLLOUT_H_
