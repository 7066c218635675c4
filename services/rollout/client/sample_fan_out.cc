#include "services/rollout/client/sample_fan_out.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"
#include "services/rollout/client/sampling_rules.h"

namespace tandem::rollout {
namespace {

// Prompts [first, end) of the call, sent to one replica in one Generate call.
struct Chunk {
  int replica, first, end;
};

std::vector<Chunk> Chunks(int prompts, int replicas) {
  std::vector<Chunk> chunks;
  for (int r = 0; r < replicas; ++r) {
    const int share_end = static_cast<int>(int64_t{prompts} * (r + 1) / replicas);
    for (int first = static_cast<int>(int64_t{prompts} * r / replicas); first < share_end;
         first += kMaxPromptsPerRequest) {
      chunks.push_back({r, first, std::min(share_end, first + kMaxPromptsPerRequest)});
    }
  }
  return chunks;
}

}  // namespace

absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> SampleFanOut::Generate(
    absl::Span<const ReplicaStub> replicas, const FanOutCall& call, const RequestBuilder& build) {
  if (replicas.empty()) return absl::FailedPreconditionError("no rollout replica to generate on");
  const std::vector<Chunk> chunks = Chunks(call.num_prompts, static_cast<int>(replicas.size()));
  std::vector<absl::StatusOr<std::vector<rollout::v1::GenerateResponse>>> results(chunks.size());
  std::vector<std::thread> threads;
  for (size_t c = 0; c < chunks.size(); ++c) {
    rollout::v1::GenerateRequest request = build(chunks[c].first, chunks[c].end);
    request.set_request_id(absl::StrCat(call.request_id_prefix, "-r", chunks[c].replica, "-c", c));
    threads.emplace_back(
        [this, &results, &call, c, stub = replicas[chunks[c].replica].stub,
         request = std::move(request)] { results[c] = GenerateOn(*stub, request, call.timeout); });
  }
  for (std::thread& thread : threads) thread.join();

  std::vector<rollout::v1::GenerateResponse> responses(static_cast<size_t>(call.num_prompts) *
                                                       call.group_size);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string& address = replicas[chunks[c].replica].address;
    if (!results[c].ok()) {
      // The replica's error details (the bad field) stay with it.
      return Annotate(results[c].status(), absl::StrCat("rollout ", address, ": "));
    }
    for (rollout::v1::GenerateResponse& response : *results[c]) {
      if (response.finish_reason() == rollout::v1::FINISH_REASON_ERROR) {
        return absl::InternalError(
            absl::StrCat("rollout sample failed: ", response.error_message()));
      }
      if (response.finish_reason() == rollout::v1::FINISH_REASON_CANCELLED) {
        return absl::UnavailableError(absl::StrCat("rollout ", address, " is draining"));
      }
      const int prompt = chunks[c].first + response.prompt_index();
      response.set_prompt_index(prompt);
      responses[static_cast<size_t>(prompt) * call.group_size + response.sample_index()] =
          std::move(response);
    }
  }
  return responses;
}

absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> SampleFanOut::GenerateOn(
    rollout::v1::RolloutService::StubInterface& stub, const rollout::v1::GenerateRequest& request,
    absl::Duration timeout) {
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  {
    absl::MutexLock lock(&mutex_);
    if (abandoned_) return absl::CancelledError("generation abandoned");
    calls_.insert(&context);
  }
  auto reader = stub.Generate(&context, request);
  std::vector<rollout::v1::GenerateResponse> responses;
  rollout::v1::GenerateResponse response;
  while (reader->Read(&response)) responses.push_back(response);
  const absl::Status status = FromGrpcStatus(reader->Finish());
  {
    absl::MutexLock lock(&mutex_);
    calls_.erase(&context);
  }
  if (!status.ok()) return status;
  return responses;
}

void SampleFanOut::Abandon() {
  absl::MutexLock lock(&mutex_);
  abandoned_ = true;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

bool SampleFanOut::abandoned() {
  absl::MutexLock lock(&mutex_);
  return abandoned_;
}

}  // namespace tandem::rollout
