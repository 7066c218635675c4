#ifndef TANDEM_SERVICES_ROLLOUT_SCHEDULER_H_
#define TANDEM_SERVICES_ROLLOUT_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/generator.h"
#include "services/rollout/adapter_registry.h"
#include "services/rollout/generation_work.h"
#include "services/router_replay/client/route_appender.h"

namespace tandem::rollout {

struct SchedulerOptions {
  // KV cache all admitted sequences may reserve together (prompt + max_new_tokens each).
  int64_t kv_cache_bytes = int64_t{256} << 20;
  // KV positions that may wait for admission; a request beyond it is RESOURCE_EXHAUSTED.
  int64_t max_queued_positions = int64_t{1} << 20;
  int max_batch_sequences = 256;
  // Prompt tokens prefilled between two decode steps (at least one prompt): bounds how long
  // running samples, and adapter swaps, wait behind a large new request.
  int max_prefill_tokens_per_step = 1024;
  // How long delivery waits for router-replay to acknowledge a sample's routes.
  absl::Duration route_ack_timeout = absl::Seconds(30);
};

// Continuous batching for one replica. A scheduler thread resolves each request's adapter
// version, admits samples FIFO while the KV budget allows (prefill), runs decode steps over
// everything admitted, swaps staged adapter versions in between steps, and hands finished samples
// to a delivery thread, which waits for router-replay to acknowledge their routes (sent in the
// background by RouteAppender) before streaming them back.
class Scheduler {
 public:
  // `appender` may be null when no router-replay is configured (recording requests then fail
  // their routes, never silently).
  Scheduler(AdapterRegistry& registry, router_replay::RouteAppender* appender,
            const engine::ModelConfig& model, SchedulerOptions options);
  // Fails requests still waiting with UNAVAILABLE and drops active samples.
  ~Scheduler();

  // Queues a request. ALREADY_EXISTS when its request_id is in flight, RESOURCE_EXHAUSTED (with
  // `retry_after` set) when the queue is full, INVALID_ARGUMENT when one sample cannot fit the
  // KV budget at all.
  absl::Status Submit(std::shared_ptr<GenerationWork> work, absl::Duration* retry_after);

  // Wakes the scheduler thread (a version was staged, a client went away).
  void Wake();

  // The replica is draining: running samples end now with what they generated and waiting ones
  // with none (FINISH_REASON_CANCELLED), and new requests are UNAVAILABLE.
  void Drain();

  int64_t kv_cache_budget() const { return options_.kv_cache_bytes; }

 private:
  struct Active;  // A sample in the decode batch.
  struct Finished;
  struct Pending;  // A request not fully admitted yet.

  void Run();
  void DropCancelled();
  void StopEverything();
  void ResolveAdapters();
  void AdmitSamples();
  void SwitchVersions();
  void CollectFinished();
  // Queues the sample's routes (sealing the record) and names the record in the response.
  void RecordRoutes(const Active& active, const engine::GeneratedSample& sample,
                    Finished& finished);
  // The request has nothing left in the scheduler: its id may be used again.
  void EndRequest(const std::string& request_id);
  void Deliver();
  void UpdateGauges();

  AdapterRegistry& registry_;
  router_replay::RouteAppender* const appender_;
  const engine::ModelConfig model_;
  const SchedulerOptions options_;
  router_replay::RouteShape route_shape_;

  // Owned by the scheduler thread.
  std::unique_ptr<engine::GenerationBatch> batch_;
  absl::flat_hash_map<int, Active> active_;
  std::deque<Pending> admitting_;  // Requests with a resolved model, FIFO.
  std::vector<Pending> resolving_;  // Requests waiting for their adapter version.
  // Per request id: samples not yet handed to delivery.
  absl::flat_hash_map<std::string, int> unfinished_;
  std::atomic<double> tokens_per_second_{0};  // Decode throughput, for retry hints.

  mutable absl::Mutex mutex_;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool woken_ ABSL_GUARDED_BY(mutex_) = false;
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::shared_ptr<GenerationWork>> submitted_ ABSL_GUARDED_BY(mutex_);
  int64_t queued_positions_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::flat_hash_set<std::string> in_flight_ ABSL_GUARDED_BY(mutex_);  // request ids
  std::deque<Finished> delivery_ ABSL_GUARDED_BY(mutex_);
  bool delivery_stopping_ ABSL_GUARDED_BY(mutex_) = false;

  std::thread scheduler_thread_;
  std::thread delivery_thread_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_SCHEDULER_H_
