#ifndef TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLE_FAN_OUT_H_
#define TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLE_FAN_OUT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"

namespace tandem::rollout {

// A rollout replica as a client reaches it.
struct ReplicaStub {
  std::string address;
  rollout::v1::RolloutService::StubInterface* stub = nullptr;  // Not owned.
};

// What one fan-out generates.
struct FanOutCall {
  int num_prompts = 0;
  int group_size = 1;
  // Request ids are "<request_id_prefix>-r<replica>-c<chunk>": a prefix unique per attempt
  // keeps a retried step's requests apart from the first try's, which may still run.
  std::string request_id_prefix;
  absl::Duration timeout = absl::Minutes(10);  // Per Generate call.
};

// Spreads prompts over rollout replicas and gathers their samples: a contiguous share of the
// prompts per replica, each share sent as Generate calls of at most kMaxPromptsPerRequest
// prompts, all in flight together. Used by the trainer for every step and by task_accuracy.
// Thread-safe; Abandon cancels every call in flight and refuses later ones (a cancelled job).
class SampleFanOut {
 public:
  // The request for prompts [first, end) of the call: prompts, sampling, adapter, routes. Its
  // request_id is set by the fan-out.
  using RequestBuilder = std::function<rollout::v1::GenerateRequest(int first, int end)>;

  // call.group_size samples per prompt, in (prompt, sample) order, prompt indices relative to
  // the whole call. A failed call is its status naming the replica; a sample that failed is
  // INTERNAL; one cancelled by a draining replica is UNAVAILABLE (try again); an abandoned
  // fan-out is CANCELLED.
  absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> Generate(
      absl::Span<const ReplicaStub> replicas, const FanOutCall& call, const RequestBuilder& build);

  void Abandon();
  bool abandoned();

 private:
  absl::StatusOr<std::vector<rollout::v1::GenerateResponse>> GenerateOn(
      rollout::v1::RolloutService::StubInterface& stub, const rollout::v1::GenerateRequest& request,
      absl::Duration timeout);

  absl::Mutex mutex_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mutex_);
  bool abandoned_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_CLIENT_SAMPLE_FAN_OUT_H_
