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
#include "engine/expert_placement.h"

namespace tandem::engine {

// Expert parallelism over the ranks of a communicator (one expert-parallel group): rank r
// computes the experts its placement gives it (by default the contiguous [r·E/size,
// (r+1)·E/size)), and each MoE layer's routed rows travel to their expert's rank and back by
// AllToAllV. Rows are grouped by expert slot (ExpertPlacement::Slots): every rank's experts
// follow each other, so what goes to one rank is one run of rows -- except with replicas,
// where a replicated expert's rows are split over its copies and travel reordered. Plan first
// exchanges the row counts per expert and copy (one small AllToAllV), so every rank knows what it
// will receive. The calls are collectives: every rank of the group runs the same MoE layers in the
// same order (forward, then backward in reverse), each on its own tokens. The communicator
// reads and writes the rows' memory directly: Gloo with host-memory (CPU) backends.
class ExpertParallelExchange final : public ExpertExchange {
 public:
  // `group` is not owned and must outlive the exchange. INVALID_ARGUMENT unless the ranks split
  // the experts evenly, or for a placement ValidatePlacement refuses. Every rank of the group must
  // be given the same placement.
  static absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> Create(Communicator& group,
                                                                        int num_experts);
  static absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> Create(Communicator& group,
                                                                        int num_experts,
                                                                        ExpertPlacement placement);

  LocalExperts local_experts() const override;
  const std::vector<int16_t>* expert_slots() const override {
    return contiguous_ ? nullptr : &slots_;
  }
  const ExpertPlacement& placement() const { return placement_; }
  // Computes with `placement` from now on, on every rank of the group, once the weights are where
  // it says: after experts moved between steps (MoveExperts), or around a mini-batch's passes
  // with replicas (HoldReplicas, ReleaseReplicas). INVALID_ARGUMENT as Create.
  absl::Status SetPlacement(ExpertPlacement placement);
  bool needs_host_memory() const override { return true; }
  absl::StatusOr<ExchangePlan> Plan(const std::vector<int>& expert_offsets) override;
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
  ExpertParallelExchange(Communicator& group, int num_experts, ExpertPlacement placement)
      : group_(group),
        num_experts_(num_experts),
        placement_(std::move(placement)),
        contiguous_(placement_ == ExpertPlacement::Contiguous(num_experts, group.size())) {
    Derive();
  }

  // slots_, copies_ and computed_ from placement_.
  void Derive();

  // Adds the floats of `counts` (per rank) that leave this rank to bytes_sent_.
  void CountSent(const std::vector<int64_t>& counts);

  Communicator& group_;
  const int num_experts_;
  ExpertPlacement placement_;
  std::vector<int16_t> slots_;
  std::vector<std::vector<int>> copies_;    // Per expert (ExpertPlacement::Copies).
  std::vector<std::vector<int>> computed_;  // Per rank (ExpertPlacement::Computed).
  bool contiguous_;                         // Slots are the experts' ids.
  int64_t bytes_sent_ = 0;
  int64_t rows_computed_ = 0;
  absl::Time dispatched_;  // When the last Dispatch returned.
  absl::Duration compute_time_;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_EXPERT_PARALLEL_EXCHANGE_H_
