#include "services/rollout/scheduler.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "services/rollout/rollout_metrics.h"

namespace tandem::rollout {
namespace {

using router_replay::RecordKey;

// The output of a sample that never ran (cancelled before admission, or one the engine could
// not admit): no tokens, and, when routes were asked for, its record key with kFailed, since no
// row of it was recorded.
SampleOutput NeverRanOutput(const GenerationWork& work, int sample, int64_t version,
                            engine::FinishReason reason, std::string error) {
  SampleOutput output{.sample = sample,
                      .finish_reason = reason,
                      .error = std::move(error),
                      .adapter_version = version};
  if (work.routes.enabled) {
    output.routes = RouteOutcome::kFailed;
    output.route_key = work.RouteKey(sample, version);
    output.route_error = "the sample never ran, so no route of it was recorded";
  }
  return output;
}

// Per generated token of a sample prefilled by `prefill_version`, the version it came from.
std::vector<int64_t> TokenVersions(int generated, int64_t prefill_version,
                                   const std::vector<std::pair<int, int64_t>>& switches) {
  std::vector<int64_t> versions;
  versions.reserve(generated);
  auto next_switch = switches.begin();
  int64_t version = prefill_version;
  for (int t = 0; t < generated; ++t) {
    for (; next_switch != switches.end() && next_switch->first <= t; ++next_switch) {
      version = next_switch->second;
    }
    versions.push_back(version);
  }
  return versions;
}

}  // namespace

struct Scheduler::Pending {
  std::shared_ptr<GenerationWork> work;
  std::shared_ptr<ServedModel> model;  // Null while resolving.
  int next_sample = 0;
};

struct Scheduler::Active {
  std::shared_ptr<GenerationWork> work;
  int sample = 0;                        // prompt * group_size + index in the group.
  int64_t prefill_version = 0;           // Names the route record.
  std::shared_ptr<ServedModel> running;  // The version its next token comes from.
  // (generated tokens before the switch, version after it), ascending.
  std::vector<std::pair<int, int64_t>> switches;
};

// What one step does to the batch, decided before the batch is touched (vLLM v1's
// SchedulerOutput); Execute applies it in this order.
struct Scheduler::StepPlan {
  std::vector<int> cancel;     // Dropped (client gone, deadline passed): KV cache freed at once.
  int64_t freed_kv_bytes = 0;  // What they had reserved.
  std::vector<int> stop;       // Draining: ended now with what they generated.
  std::vector<Pending> admit;  // One per sample to admit, FIFO (next_sample is its index).
  std::vector<SequenceBatch::SampleToAdmit> samples;  // Their engine requests, in order.
  // A sequence that moves to a newer version: a running one by id, or one this plan admits by
  // its index in `admit`.
  struct Switch {
    int id = -1;
    int admitted = -1;
    std::shared_ptr<ServedModel> to;
  };
  std::vector<Switch> switches;
};

struct Scheduler::Finished {
  std::shared_ptr<GenerationWork> work;
  SampleOutput output;
  bool routes_queued = false;    // Its routes went to router-replay: delivery awaits their ack.
  absl::Status route_error;      // Set when queueing the routes already failed.
  bool ends_request = false;     // The request's last sample: its id is free once delivered.
};

Scheduler::Scheduler(ServedModels& models, std::unique_ptr<SequenceBatch> batch,
                     router_replay::RouteSink* routes, const engine::ModelConfig& model,
                     SchedulerOptions options)
    : models_(models),
      routes_(routes),
      options_(options),
      route_shape_{model.MoeLayerIndices(), model.top_k, model.num_experts},
      batch_(std::move(batch)),
      delivery_thread_([this] { Deliver(); }) {
  RolloutMetrics::Get().kv_cache_budget_bytes.Set(static_cast<double>(options_.kv_cache_bytes));
  UpdateGauges();  // Nothing a previous scheduler in this process left may show as ours.
}

Scheduler::~Scheduler() {
  Shutdown();
  const absl::Status shutting_down = absl::UnavailableError("rollout replica is shutting down");
  absl::flat_hash_set<GenerationWork*> failed;
  const auto fail = [&](const std::shared_ptr<GenerationWork>& work) {
    if (failed.insert(work.get()).second) work->fail(shutting_down);
  };
  for (Pending& pending : resolving_) fail(pending.work);
  for (Pending& pending : admitting_) fail(pending.work);
  for (auto& [id, active] : active_) fail(active.work);
  std::vector<std::shared_ptr<GenerationWork>> submitted;
  {
    absl::MutexLock lock(&mutex_);
    submitted.swap(submitted_);
  }
  for (auto& work : submitted) fail(work);  // Outside mutex_: fail takes the stream's lock.
  {
    absl::MutexLock lock(&mutex_);
    delivery_stopping_ = true;
  }
  delivery_thread_.join();
}

absl::Status Scheduler::Submit(std::shared_ptr<GenerationWork> work, absl::Duration* retry_after) {
  int64_t largest = 0;  // A prompt's samples all reserve as much.
  for (int s = 0; s < work->num_samples(); s += work->group_size) {
    largest = std::max(largest, batch_->ReservedBytes(work->Positions(s)));
  }
  if (largest > options_.kv_cache_bytes) {
    // Prompt length and max_new_tokens together, against this replica's memory: no one field.
    return InvalidRequest("SAMPLE_EXCEEDS_KV_CACHE",
                          absl::StrCat("a sample needs ", largest,
                                       " bytes of KV cache; this replica's budget is ",
                                       options_.kv_cache_bytes, " (--kv_cache_mib)"));
  }
  absl::MutexLock lock(&mutex_);
  if (stopping_ || draining_) return absl::UnavailableError("rollout replica is shutting down");
  const std::string& id = work->request_id;
  if (in_flight_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " is in flight"));
  }
  if (queued_positions_ > 0 &&
      queued_positions_ + work->reserved_positions > options_.max_queued_positions) {
    // The queue drains at about the decode rate (positions include prompts, so this errs long).
    const double tokens_per_second = std::max(tokens_per_second_.load(), 1.0);
    *retry_after =
        std::clamp(absl::Seconds(static_cast<double>(queued_positions_) / tokens_per_second),
                   absl::Milliseconds(100), absl::Seconds(30));
    return absl::ResourceExhaustedError(
        absl::StrCat("replica has ", queued_positions_, " KV positions queued; this request needs ",
                     work->reserved_positions, " and the limit is ", options_.max_queued_positions,
                     "; retry in ", absl::FormatDuration(*retry_after)));
  }
  queued_positions_ += work->reserved_positions;
  in_flight_.insert(id);
  submitted_.push_back(std::move(work));
  woken_ = true;
  return absl::OkStatus();
}

void Scheduler::Wake() {
  absl::MutexLock lock(&mutex_);
  woken_ = true;
}

void Scheduler::Drain() {
  absl::MutexLock lock(&mutex_);
  draining_ = true;
  woken_ = true;
}

void Scheduler::Shutdown() {
  absl::MutexLock lock(&mutex_);
  stopping_ = true;
}

bool Scheduler::AwaitWork() {
  absl::MutexLock lock(&mutex_);
  const auto ready = [this] {
    mutex_.AssertHeld();
    return stopping_ || woken_ || !submitted_.empty();
  };
  if (active_.empty() && admitting_.empty()) {
    mutex_.AwaitWithTimeout(absl::Condition(&ready),
                            resolving_.empty() ? options_.idle_poll : options_.resolve_poll);
  }
  return !stopping_;
}

void Scheduler::RunStep() {
  Execute(Plan());
  CollectFinished();
  UpdateGauges();
}

void Scheduler::TakeSubmitted(bool* draining) {
  absl::MutexLock lock(&mutex_);
  woken_ = false;
  *draining = draining_;
  for (auto& work : submitted_) {
    unfinished_[work->request_id] = work->num_samples();
    resolving_.push_back({.work = std::move(work)});
  }
  submitted_.clear();
}

Scheduler::StepPlan Scheduler::Plan() {
  StepPlan plan;
  bool draining = false;
  TakeSubmitted(&draining);
  models_.PromoteStaged();  // The swap point: between decode steps.
  DropCancelled(plan);
  if (draining) StopEverything(plan);
  ResolveAdapters();
  AdmitSamples(plan);
  SwitchVersions(plan);
  return plan;
}

void Scheduler::Execute(const StepPlan& plan) {
  for (int id : plan.cancel) batch_->Cancel(id);
  for (int id : plan.stop) batch_->Stop(id);  // Finished below, CANCELLED.
  std::vector<int> admitted_ids;
  if (!plan.samples.empty()) {
    std::vector<absl::StatusOr<int>> ids = batch_->Admit(plan.samples);
    for (size_t i = 0; i < ids.size(); ++i) {
      admitted_ids.push_back(StartSample(plan.admit[i], ids[i]));
    }
  }
  for (const StepPlan::Switch& planned : plan.switches) {
    const int id = planned.admitted >= 0 ? admitted_ids[planned.admitted] : planned.id;
    if (id < 0) continue;  // Its admission failed.
    const int generated = batch_->Switch(id, *planned.to);
    if (generated < 0) continue;  // Finished in its prefill; nothing left to switch.
    Active& active = active_.at(id);
    active.switches.emplace_back(generated, planned.to->version);
    --active.running->active_samples;
    ++planned.to->active_samples;
    active.running = planned.to;
  }
  Decode();
}

void Scheduler::Decode() {
  if (batch_->active() == 0) return;
  const int rows = batch_->active();
  const absl::Time begin = absl::Now();
  batch_->Step();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - begin);
  RolloutMetrics::Get().decode_step_seconds.Observe(seconds);
  RolloutMetrics::Get().tokens_generated.Increment(rows);
  if (seconds > 0) tokens_per_second_ = 0.9 * tokens_per_second_ + 0.1 * rows / seconds;
}

void Scheduler::StopEverything(StepPlan& plan) {
  for (const auto& [id, active] : active_) plan.stop.push_back(id);
  // Samples never admitted end CANCELLED with no tokens.
  const auto cancel_pending = [this](Pending& pending) {
    GenerationWork& work = *pending.work;
    for (int s = pending.next_sample; s < work.num_samples(); ++s) {
      Finished finished{
          .work = pending.work,
          .output = NeverRanOutput(work, s, pending.model == nullptr ? 0 : pending.model->version,
                                   engine::FinishReason::kCancelled, "")};
      {
        absl::MutexLock lock(&mutex_);
        queued_positions_ -= work.Positions(s);
      }
      QueueDelivery(std::move(finished));
    }
  };
  for (Pending& pending : resolving_) cancel_pending(pending);
  for (Pending& pending : admitting_) cancel_pending(pending);
  resolving_.clear();
  admitting_.clear();
}

void Scheduler::DropCancelled(StepPlan& plan) {
  const absl::Time now = options_.clock->Now();
  // Request ids, and the requests whose client must hear of the passed deadline.
  absl::flat_hash_set<std::string> dropped;
  std::vector<std::shared_ptr<GenerationWork>> expired_requests;
  const auto drop = [&](const std::shared_ptr<GenerationWork>& work) {
    const bool expired = now > work->deadline;
    if (!work->cancelled && !expired) return false;
    if (dropped.insert(work->request_id).second && expired && !work->cancelled) {
      expired_requests.push_back(work);
    }
    return true;
  };
  for (auto it = active_.begin(); it != active_.end();) {
    if (!drop(it->second.work)) {
      ++it;
      continue;
    }
    plan.cancel.push_back(it->first);  // Frees its KV cache before this step's admissions.
    plan.freed_kv_bytes += batch_->ReservedBytes(it->second.work->Positions(it->second.sample));
    --it->second.running->active_samples;
    active_.erase(it++);
  }
  const auto drop_pending = [&](Pending& pending) {
    if (!drop(pending.work)) return false;
    int64_t positions = 0;
    for (int s = pending.next_sample; s < pending.work->num_samples(); ++s) {
      positions += pending.work->Positions(s);
    }
    absl::MutexLock lock(&mutex_);
    queued_positions_ -= positions;
    return true;
  };
  std::erase_if(admitting_, drop_pending);
  std::erase_if(resolving_, drop_pending);
  for (const std::string& request_id : dropped) EndRequest(request_id);
  for (const auto& work : expired_requests) {
    work->fail(absl::DeadlineExceededError(absl::StrCat(
        "request ", work->request_id, ": deadline passed before all samples finished")));
  }
}

void Scheduler::EndRequest(const std::string& request_id) {
  unfinished_.erase(request_id);
  absl::MutexLock lock(&mutex_);
  in_flight_.erase(request_id);
}

void Scheduler::ResolveAdapters() {
  const absl::Time now = options_.clock->Now();
  std::vector<std::pair<std::shared_ptr<GenerationWork>, absl::Status>> failed;
  std::erase_if(resolving_, [&](Pending& pending) {
    GenerationWork& work = *pending.work;
    absl::StatusOr<std::shared_ptr<ServedModel>> model = models_.TryResolve(work.adapter);
    if (model.ok() && *model == nullptr && now <= work.deadline) return false;
    if (model.ok() && *model != nullptr) {
      pending.model = *std::move(model);
      admitting_.push_back(std::move(pending));
      return true;
    }
    failed.emplace_back(pending.work,
                        model.ok() ? absl::DeadlineExceededError(absl::StrCat(
                                         "adapter '", work.adapter.adapter_name(),
                                         "': the selected version was not servable before the "
                                         "deadline"))
                                   : model.status());
    absl::MutexLock lock(&mutex_);
    queued_positions_ -= work.reserved_positions;
    return true;
  });
  // The id is free before the client hears of the failure, so it can retry at once.
  for (auto& [work, status] : failed) {
    EndRequest(work->request_id);
    work->fail(std::move(status));
  }
}

void Scheduler::AdmitSamples(StepPlan& plan) {
  // The samples that fit this step, FIFO: while the head cannot be admitted, nothing behind it
  // is. They are admitted together, so the engine prefills their prompts in one pass.
  std::vector<Pending>& chosen = plan.admit;
  std::vector<SequenceBatch::SampleToAdmit>& samples = plan.samples;
  // What the batch holds once this plan's cancellations freed theirs.
  int active = batch_->active() - static_cast<int>(plan.cancel.size());
  int64_t kv_cache_bytes = batch_->kv_cache_bytes() - plan.freed_kv_bytes, prefilled = 0;
  while (!admitting_.empty()) {
    Pending& pending = admitting_.front();
    GenerationWork& work = *pending.work;
    for (; pending.next_sample < work.num_samples(); ++pending.next_sample) {
      const int64_t needed = batch_->ReservedBytes(work.Positions(pending.next_sample));
      if (active >= options_.max_batch_sequences ||
          kv_cache_bytes + needed > options_.kv_cache_bytes ||
          prefilled >= options_.max_prefill_tokens_per_step) {
        break;
      }
      samples.push_back({.request = work.Sample(pending.next_sample), .model = pending.model.get()});
      chosen.push_back(pending);
      prefilled += static_cast<int64_t>(samples.back().request.prompt.size());
      kv_cache_bytes += needed;
      ++active;
    }
    if (pending.next_sample < work.num_samples()) break;
    admitting_.pop_front();
  }
}

int Scheduler::StartSample(const Pending& admitted, const absl::StatusOr<int>& id) {
  GenerationWork& work = *admitted.work;
  const int sample = admitted.next_sample;
  {
    absl::MutexLock lock(&mutex_);
    queued_positions_ -= work.Positions(sample);
  }
  // PrepareWork checked the request; what can still fail is the engine (e.g. a GPU whose
  // memory cannot hold the sequence's cache). That is this sample's failure, answered in its own
  // message (FINISH_REASON_ERROR); the request's other samples go on.
  if (!id.ok()) {
    spdlog::error("request {} sample {}: admit failed: {}", work.request_id, sample,
                  id.status().ToString());
    Finished finished{.work = admitted.work,
                      .output = NeverRanOutput(
                          work, sample, admitted.model->version, engine::FinishReason::kError,
                          absl::StrCat("admit failed: ", id.status().message()))};
    QueueDelivery(std::move(finished));
    return -1;
  }
  ++admitted.model->active_samples;
  RolloutMetrics::Get().time_to_first_token_seconds.Observe(
      absl::ToDoubleSeconds(absl::Now() - work.start));
  active_[*id] = Active{.work = admitted.work,
                        .sample = sample,
                        .prefill_version = admitted.model->version,
                        .running = admitted.model};
  return *id;
}

void Scheduler::SwitchVersions(StepPlan& plan) {
  absl::flat_hash_map<std::string, std::shared_ptr<ServedModel>> current;
  // The newest version of the sample's adapter, when it may and has yet to move there.
  const auto newer = [&](const GenerationWork& work,
                         const ServedModel& running) -> std::shared_ptr<ServedModel> {
    if (!work.allow_version_switch || running.adapter.empty()) return nullptr;
    auto [slot, inserted] = current.try_emplace(running.adapter);
    if (inserted) slot->second = models_.Current(running.adapter);
    const std::shared_ptr<ServedModel>& newest = slot->second;
    return newest != nullptr && newest->version > running.version ? newest : nullptr;
  };
  for (auto& [id, active] : active_) {
    if (auto to = newer(*active.work, *active.running))
      plan.switches.push_back({.id = id, .to = to});
  }
  for (size_t i = 0; i < plan.admit.size(); ++i) {
    if (auto to = newer(*plan.admit[i].work, *plan.admit[i].model)) {
      plan.switches.push_back({.admitted = static_cast<int>(i), .to = to});
    }
  }
}

void Scheduler::CollectFinished() {
  for (auto& [id, sample] : batch_->TakeFinished()) {
    auto found = active_.find(id);
    Active active = std::move(found->second);
    active_.erase(found);
    --active.running->active_samples;
    const int generated = static_cast<int>(sample.tokens.size()) - sample.prompt_length;
    Finished finished{
        .work = active.work,
        .output = {.sample = active.sample,
                   .tokens = {sample.tokens.begin() + sample.prompt_length, sample.tokens.end()},
                   .logprobs = sample.logprobs,
                   .finish_reason = sample.finish_reason,
                   .error = sample.error,
                   .adapter_version = active.prefill_version}};
    if (active.work->allow_version_switch) {
      finished.output.token_versions =
          TokenVersions(generated, active.prefill_version, active.switches);
    }
    RecordRoutes(active, sample, finished);
    QueueDelivery(std::move(finished));
  }
}

// The request's id stays in flight until the delivery thread has handed over its last sample,
// which may first wait up to route_ack_timeout for route acknowledgements: until then its
// stream is open, and a second Generate with the id would record the same route keys.
void Scheduler::QueueDelivery(Finished finished) {
  const std::string& id = finished.work->request_id;
  if (--unfinished_[id] == 0) {
    unfinished_.erase(id);
    finished.ends_request = true;
  }
  absl::MutexLock lock(&mutex_);
  delivery_.push_back(std::move(finished));
}

void Scheduler::RecordRoutes(const Active& active, const engine::GeneratedSample& sample,
                             Finished& finished) {
  const GenerationWork& work = *active.work;
  if (!work.routes.enabled) return;
  RecordKey key = work.RouteKey(active.sample, active.prefill_version);
  const int64_t rows = static_cast<int64_t>(sample.tokens.size()) - 1;
  finished.route_error =
      routes_ == nullptr
          ? absl::FailedPreconditionError("this replica has no router-replay (--router_replay)")
          : routes_->Append(key, route_shape_, 0, rows, sample.routes.data(), /*seal=*/true);
  if (finished.route_error.ok()) RolloutMetrics::Get().routes_rows_sent.Increment(rows);
  finished.output.route_rows = rows;
  finished.output.route_key = std::move(key);
  finished.routes_queued = true;
}

void Scheduler::Deliver() {
  while (true) {
    Finished finished;
    {
      absl::MutexLock lock(&mutex_);
      const auto ready = [this] {
        mutex_.AssertHeld();
        return delivery_stopping_ || !delivery_.empty();
      };
      mutex_.Await(absl::Condition(&ready));
      if (delivery_.empty()) return;
      finished = std::move(delivery_.front());
      delivery_.pop_front();
    }
    SampleOutput& output = finished.output;
    if (finished.routes_queued) {
      absl::Status routes = finished.route_error;
      if (routes.ok()) {
        routes =
            routes_->WaitForRecord(*output.route_key, absl::Now() + options_.route_ack_timeout);
      }
      if (routes.ok()) {
        output.routes = RouteOutcome::kRecorded;
      } else {
        output.routes = RouteOutcome::kFailed;
        output.route_error = routes.ToString(absl::StatusToStringMode::kWithNoExtraData);
        output.route_rows = 0;
        RolloutMetrics::Get().route_failures.Increment();
      }
    }
    RolloutMetrics::Get().samples.Increment();
    finished.work->deliver(std::move(output));
    if (finished.ends_request) {
      absl::MutexLock lock(&mutex_);
      in_flight_.erase(finished.work->request_id);
    }
  }
}

void Scheduler::UpdateGauges() {
  RolloutMetrics& metrics = RolloutMetrics::Get();
  metrics.batch_occupancy.Set(batch_->active());
  metrics.kv_cache_used_bytes.Set(static_cast<double>(batch_->kv_cache_bytes()));
  absl::MutexLock lock(&mutex_);
  metrics.queued_tokens.Set(static_cast<double>(queued_positions_));
}

}  // namespace tandem::rollout
