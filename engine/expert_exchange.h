#ifndef TANDEM_ENGINE_EXPERT_EXCHANGE_H_
#define TANDEM_ENGINE_EXPERT_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/buffer.h"
#include "engine/model_ops.h"

namespace tandem::engine {

// The experts one rank computes, as global ids in the order its grouped projections take them
// (local expert i is experts[i]). The rank holds their weights in that order: every expert of the
// model (when they are 0..E-1), or its shard (BaseModel::ExpertShard(experts)).
struct LocalExperts {
  std::vector<int> experts;
};

// How Dispatch moves one MoE layer's routed rows: kept with the layer's activations, because
// Combine moves the results back along the same paths and the backward pass moves gradients
// along them too.
struct ExchangePlan {
  // The dispatched rows of local expert i are [local_offsets[i], local_offsets[i + 1]).
  std::vector<int> local_offsets;
  // Expert parallelism only: the rows this rank sends to each rank, and those it receives from
  // each rank for each local expert ([source * local experts + i]).
  std::vector<int64_t> sent_to_rank;
  std::vector<int64_t> received;
  // With replicas only: this rank's routed rows in the order they travel (by destination rank,
  // then the destination's local experts), as runs of the rows Dispatch is given; empty when
  // that order is theirs already.
  struct RowRun {
    int64_t first = 0;
    int64_t count = 0;
  };
  std::vector<RowRun> outgoing;
};

// The expert-parallel seam of the MoE block, where vLLM's modular MoE has its prepare/finalize
// pair around the expert computation: Dispatch moves each routed row to the rank that computes
// its expert, Combine moves the results back to where the rows came from. Both are linear and
// each is the other's transpose, so the backward pass reuses them with the forward's plan:
// Dispatch carries the gradients of the experts' outputs to the experts, Combine the gradients of
// their inputs back. Routes stay logical (global) expert ids; which rank computes an expert is
// the exchange's business. With expert parallelism every rank of the group calls Plan, Dispatch
// and Combine for the same layer in the same order (they may be collectives).
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;

  // The experts this rank computes in MoE layer `moe_layer` (the layer's place among the model's
  // MoE layers: each layer may place its experts differently). An exchange that places experts
  // per layer refuses a layer it was not made for with INVALID_ARGUMENT.
  virtual absl::StatusOr<LocalExperts> local_experts(int moe_layer) const = 0;
  // The order Plan takes MoE layer `moe_layer`'s routed rows in (a layer local_experts accepts):
  // each global expert's slot ([num_experts]; the rows of slot 0 first). Null: by global id.
  virtual const std::vector<int16_t>* expert_slots(int /*moe_layer*/) const { return nullptr; }
  // Whether Dispatch and Combine read and write the rows' memory themselves (host memory only).
  virtual bool needs_host_memory() const { return false; }
  // `expert_offsets` [num_experts + 1]: this rank's routed rows of MoE layer `moe_layer`, grouped
  // by expert slot.
  virtual absl::StatusOr<ExchangePlan> Plan(int moe_layer,
                                            const std::vector<int>& expert_offsets) = 0;
  // Replaces `rows` — this rank's routed rows [expert_offsets.back(), width], grouped by expert
  // slot, in the memory of `ops` — by the rows its local experts compute
  // [plan.local_offsets.back(), width].
  virtual absl::Status Dispatch(const ExchangePlan& plan, int width, Buffer<float>& rows,
                                ModelOps& ops) = 0;
  // The inverse: replaces the local experts' rows by this rank's routed rows, each back in the
  // place Dispatch took it from.
  virtual absl::Status Combine(const ExchangePlan& plan, int width, Buffer<float>& rows,
                               ModelOps& ops) = 0;
};

// INVALID_ARGUMENT unless `expert_offsets` groups rows by each of `num_experts` experts: one
// offset more than experts, from 0, never decreasing.
absl::Status CheckExpertOffsets(const std::vector<int>& expert_offsets, int num_experts);

// One rank computing every expert (no expert parallelism): the plan is the routing's own grouping
// and rows stay where they are.
class AllExpertsLocal final : public ExpertExchange {
 public:
  explicit AllExpertsLocal(int num_experts);

  absl::StatusOr<LocalExperts> local_experts(int /*moe_layer*/) const override { return local_; }
  absl::StatusOr<ExchangePlan> Plan(int moe_layer, const std::vector<int>& expert_offsets) override;
  absl::Status Dispatch(const ExchangePlan& /*plan*/, int /*width*/, Buffer<float>& /*rows*/,
                        ModelOps& /*ops*/) override {
    return absl::OkStatus();
  }
  absl::Status Combine(const ExchangePlan& /*plan*/, int /*width*/, Buffer<float>& /*rows*/,
                       ModelOps& /*ops*/) override {
    return absl::OkStatus();
  }

 private:
  const int num_experts_;
  const LocalExperts local_;  // Experts 0..num_experts-1.
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_EXPERT_EXCHANGE_H_
