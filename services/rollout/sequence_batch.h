#ifndef TANDEM_SERVICES_ROLLOUT_SEQUENCE_BATCH_H_
#define TANDEM_SERVICES_ROLLOUT_SEQUENCE_BATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/generator.h"
#include "services/rollout/served_model.h"
#include "spdlog/spdlog.h"
#include "tandem/rollout/v1/rollout.pb.h"

namespace tandem::rollout {

// What the scheduler executes: a continuous batch of sequences, each running on a served model
// (an adapter version). EngineBatch runs the embedded engine; scheduler tests use a model-free
// fake. Used from the scheduler's stepping thread only, except ReservedBytes, which is a pure
// function of the model and may be called from any thread (Submit).
class SequenceBatch {
 public:
  virtual ~SequenceBatch() = default;

  struct SampleToAdmit {
    engine::GenerationRequest request;
    const ServedModel* model = nullptr;  // Never null.
  };
  // Reserves each sample's KV cache, prefills the prompts on their models (each model's
  // together) and samples each one's first token; returns each sample's sequence id, or why it
  // could not be admitted, in order.
  virtual std::vector<absl::StatusOr<int>> Admit(const std::vector<SampleToAdmit>& samples) = 0;
  // Runs the sequence's later steps on `model`; returns how many tokens it had generated
  // before, or -1 for an unknown (finished) id.
  virtual int Switch(int id, const ServedModel& model) = 0;
  // One decode step of every active sequence.
  virtual void Step() = 0;
  // Sequences that finished since the last call, with their ids.
  virtual std::vector<std::pair<int, engine::GeneratedSample>> TakeFinished() = 0;
  // Drops a sequence and frees its KV cache.
  virtual void Cancel(int id) = 0;
  // Ends a sequence now with what it generated (returned by the next TakeFinished).
  virtual bool Stop(int id) = 0;

  virtual int active() const = 0;
  virtual int64_t kv_cache_bytes() const = 0;
  // KV-cache bytes `positions` positions (a sample's prompt + max_new_tokens) reserve.
  virtual int64_t ReservedBytes(int64_t positions) const = 0;
};

// The adapter versions the scheduler resolves requests to; AdapterRegistry in the service.
class ServedModels {
 public:
  virtual ~ServedModels() = default;
  // The swap point: staged versions become servable; returns how many.
  virtual int PromoteStaged() = 0;
  // A model; nullptr while the request must wait; or why it never can.
  virtual absl::StatusOr<std::shared_ptr<ServedModel>> TryResolve(
      const type::v1::AdapterSelector& selector) = 0;
  // The version new requests for `adapter` get; nullptr if none.
  virtual std::shared_ptr<ServedModel> Current(const std::string& adapter) const = 0;
};

// The embedded engine's GenerationBatch as a SequenceBatch.
class EngineBatch final : public SequenceBatch {
 public:
  // `base` runs sequences admitted on a model without an engine; it must outlive the batch.
  explicit EngineBatch(engine::DecodeEngine& base) : batch_(base) {}

  std::vector<absl::StatusOr<int>> Admit(const std::vector<SampleToAdmit>& samples) override {
    std::vector<engine::GenerationBatch::Admission> admissions;
    for (const SampleToAdmit& sample : samples) {
      admissions.push_back({.request = sample.request, .engine = sample.model->engine.get()});
    }
    return batch_.AdmitAll(admissions);
  }
  int Switch(int id, const ServedModel& model) override {
    return batch_.SwitchEngine(id, *model.engine);
  }
  // A step fails only on a device fault; the failed sequences have then ended with
  // FinishReason::kError (FINISH_REASON_ERROR to the client, which fails rather than retries).
  void Step() override {
    if (absl::Status status = batch_.Step(); !status.ok()) {
      spdlog::error("decode step failed: {}", status.ToString());
    }
  }
  std::vector<std::pair<int, engine::GeneratedSample>> TakeFinished() override {
    return batch_.TakeFinished();
  }
  void Cancel(int id) override { batch_.Cancel(id); }
  bool Stop(int id) override { return batch_.Stop(id); }
  int active() const override { return batch_.active(); }
  int64_t kv_cache_bytes() const override { return batch_.kv_cache_bytes(); }
  int64_t ReservedBytes(int64_t positions) const override {
    return positions * batch_.kv_bytes_per_token();
  }

 private:
  engine::GenerationBatch batch_;
};

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_SEQUENCE_BATCH_H_
