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
#include "common/clock.h"
#include "engine/generator.h"
#include "services/rollout/generation_work.h"
#include "services/rollout/sequence_batch.h"
#include "services/router_replay/client/route_sink.h"

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
  // With nothing running, how often the step thread looks again for cancellations and
  // deadlines, and for adapter versions that became servable while requests wait for them.
  absl::Duration idle_poll = absl::Milliseconds(50);
  absl::Duration resolve_poll = absl::Milliseconds(5);
  // What requests' deadlines are compared with; not owned.
  Clock* clock = &Clock::Real();
};

// Continuous batching for one replica, as vLLM v1 structures it: each step plans (takes new
// requests, swaps staged adapter versions in, drops cancelled samples, resolves each request's
// adapter version, admits samples FIFO while the KV budget and the prefill budget allow, moves
// samples to newer versions), executes one decode step of the batch, and applies its output
// (finished samples become SampleOutputs in the replica's own types, their routes are queued to
// router-replay). A delivery thread waits for router-replay to acknowledge a sample's routes
// before handing it to its request, whose front end makes the API's message of it. The scheduler
// owns no model and no step thread: it runs on a SequenceBatch and ServedModels it is given,
// stepped by a SchedulerThread in the service and by hand in tests.
class Scheduler {
 public:
  // `routes` (router-replay's RouteAppender in the service) may be null when no router-replay is
  // configured: recording requests then fail their routes, never silently. `model` gives the
  // route shape.
  Scheduler(ServedModels& models, std::unique_ptr<SequenceBatch> batch,
            router_replay::RouteSink* routes, const engine::ModelConfig& model,
            SchedulerOptions options);
  // Fails requests still waiting with UNAVAILABLE and drops active samples. Stop the
  // SchedulerThread first.
  ~Scheduler();

  // Queues a request. ALREADY_EXISTS when its request_id is in flight, RESOURCE_EXHAUSTED (with
  // `retry_after` set) when the queue is full, INVALID_ARGUMENT when one sample cannot fit the
  // KV budget at all.
  absl::Status Submit(std::shared_ptr<GenerationWork> work, absl::Duration* retry_after);
  // Wakes the step thread (a version was staged, a client went away).
  void Wake();
  // The replica is draining: running samples end now with what they generated and waiting ones
  // with none (FINISH_REASON_CANCELLED), and new requests are UNAVAILABLE.
  void Drain();
  int64_t kv_cache_budget() const { return options_.kv_cache_bytes; }

  // One step: plan (StepPlan, plain data), execute it on the batch, apply its results. Call from
  // one thread at a time.
  void RunStep();
  // Blocks while there is nothing to do: returns at once while samples are running or waiting
  // for admission, else when
  // woken, a request arrives or a poll interval passes (adapter resolution and cancellations
  // have no event). False once Shutdown was called.
  bool AwaitWork();
  // Makes AwaitWork return false from now on.
  void Shutdown();

 private:
  struct Active;  // A sample in the decode batch.
  struct Finished;
  struct Pending;  // A request not fully admitted yet.

  struct StepPlan;

  // Plan: everything decided between two decode steps, as data; the batch is not touched.
  StepPlan Plan();
  void TakeSubmitted(bool* draining);
  void DropCancelled(StepPlan& plan);
  void StopEverything(StepPlan& plan);
  void ResolveAdapters();
  void AdmitSamples(StepPlan& plan);
  void SwitchVersions(StepPlan& plan);
  // Execute: the plan applied to the batch, then one decode step.
  void Execute(const StepPlan& plan);
  // Records an admitted sample as active (returning its id), or answers the sample the engine
  // could not admit (returning -1).
  int StartSample(const Pending& admitted, const absl::StatusOr<int>& id);
  void Decode();
  // Apply: the step's finished samples become responses.
  void CollectFinished();
  // Queues the sample's routes (sealing the record) and names the record in the response.
  void RecordRoutes(const Active& active, const engine::GeneratedSample& sample,
                    Finished& finished);
  // The request failed or was dropped: its id may be used again at once.
  void EndRequest(const std::string& request_id);
  // Queues a sample's response; the request's last one frees its id once delivered.
  void QueueDelivery(Finished finished);
  void Deliver();
  void UpdateGauges();

  ServedModels& models_;
  router_replay::RouteSink* const routes_;
  const SchedulerOptions options_;
  const router_replay::RouteShape route_shape_;

  // Owned by the stepping thread.
  const std::unique_ptr<SequenceBatch> batch_;
  absl::flat_hash_map<int, Active> active_;
  std::deque<Pending> admitting_;   // Requests with a resolved model, FIFO.
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
  std::thread delivery_thread_;
};

// Steps a scheduler on its own thread until destroyed.
class SchedulerThread {
 public:
  explicit SchedulerThread(Scheduler& scheduler)
      : scheduler_(scheduler), thread_([this] {
          while (scheduler_.AwaitWork()) scheduler_.RunStep();
        }) {}
  ~SchedulerThread() {
    scheduler_.Shutdown();
    thread_.join();
  }

 private:
  Scheduler& scheduler_;
  std::thread thread_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_SCHEDULER_H_
