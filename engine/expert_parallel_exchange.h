#ifndef TANDEM_ENGINE_EXPERT_PARALLEL_EXCHANGE_H_
#define TANDEM_ENGINE_EXPERT_PARALLEL_EXCHANGE_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/communicator.h"
#include "engine/expert_exchange.h"
#include "placement/expert_placement.h"

namespace tandem::engine {

// Expert parallelism over the ranks of a communicator (one expert-parallel group): in each MoE
// layer rank r computes the experts that layer's placement gives it (by default the contiguous
// [r·E/size, (r+1)·E/size) in every layer), and each MoE layer's routed rows travel to their
// expert's rank and back by AllToAllV. Rows are grouped by expert slot
// (placement::ExpertPlacement::Slots): every rank's experts follow each other, so what goes to one
// rank is one run of rows -- except with replicas, where a replicated expert's rows are split over
// its copies and travel reordered. Plan first exchanges the row counts per expert and copy (one
// small AllToAllV), so every rank knows what it will receive. The calls are collectives: every rank
// of the group runs the same MoE layers in the same order (forward, then backward in reverse), each
// on its own tokens. The communicator reads and writes the rows' memory directly: Gloo with
// host-memory (CPU) backends.
class ExpertParallelExchange final : public ExpertExchange {
 public:
  // For a model of `moe_layers` MoE layers. `group` is not owned and must outlive the exchange.
  // INVALID_ARGUMENT unless the ranks split the experts evenly, or for placements
  // placement::ValidatePlacements refuses. Every rank of the group must be given the same
  // placements.
  static absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> Create(Communicator& group,
                                                                        int num_experts,
                                                                        int moe_layers);
  static absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> Create(
      Communicator& group, int num_experts, placement::LayerPlacements placements);

  absl::StatusOr<LocalExperts> local_experts(int moe_layer) const override;
  const std::vector<int16_t>* expert_slots(int moe_layer) const override {
    const Layer& layer = layers_[moe_layer];
    return layer.contiguous ? nullptr : &layer.slots;
  }
  const placement::LayerPlacements& placements() const { return placements_; }
  // Computes with `placements` from now on, on every rank of the group, once the weights are
  // where they say: after experts moved between steps (placement::MoveExperts), or around a
  // mini-batch's passes with replicas (placement::HoldReplicas, placement::ReleaseReplicas).
  // INVALID_ARGUMENT as Create.
  absl::Status SetPlacements(placement::LayerPlacements placements);
  bool needs_host_memory() const override { return true; }
  absl::StatusOr<ExchangePlan> Plan(int moe_layer, const std::vector<int>& expert_offsets) override;
  // Received rows arrive by source rank; they are regrouped by local expert (sources in rank
  // order within an expert), and Combine undoes that before sending results back.
  absl::Status Dispatch(const ExchangePlan& plan, int width, Buffer<float>& rows,
                        ModelOps& ops) override;
  absl::Status Combine(const ExchangePlan& plan, int width, Buffer<float>& rows,
                       ModelOps& ops) override;

  // Bytes of rows this rank has sent to other ranks by Dispatch and Combine (rows for its own
  // experts stay), since it was made: the all-to-all traffic to hold against the routes. Plan's
  // counts (a float per expert and copy per layer) are not included.
  int64_t bytes_sent() const { return bytes_sent_; }
  // Rows this rank's experts received by Dispatch (its own included), since it was made.
  int64_t rows_computed() const { return rows_computed_; }
  // Time from each Dispatch's end to the next Combine's start, since it was made: the local
  // experts' computation (forward, and backward), without the exchanges around it.
  absl::Duration compute_time() const { return compute_time_; }

 private:
  // What Plan needs of one MoE layer's placement, derived once.
  struct Layer {
    std::vector<int16_t> slots;
    std::vector<std::vector<int>> copies;    // Per expert (placement::ExpertPlacement::Copies).
    std::vector<std::vector<int>> computed;  // Per rank (placement::ExpertPlacement::Computed).
    bool contiguous = false;                 // Slots are the experts' ids.
  };

  ExpertParallelExchange(Communicator& group, int num_experts,
                         placement::LayerPlacements placements)
      : group_(group), num_experts_(num_experts), placements_(std::move(placements)) {
    Derive();
  }

  // layers_ from placements_.
  void Derive();

  // Adds the floats of `counts` (per rank) that leave this rank to bytes_sent_.
  void CountSent(const std::vector<int64_t>& counts);

  Communicator& group_;
  const int num_experts_;
  placement::LayerPlacements placements_;
  std::vector<Layer> layers_;  // Per MoE layer.
  int64_t bytes_sent_ = 0;
  int64_t rows_computed_ = 0;
  absl::Time dispatched_;  // When the last Dispatch returned.
  absl::Duration compute_time_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_EXPERT_PARALLEL_EXCHANGE_H_
