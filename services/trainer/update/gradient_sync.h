#ifndef TANDEM_SERVICES_TRAINER_UPDATE_GRADIENT_SYNC_H_
#define TANDEM_SERVICES_TRAINER_UPDATE_GRADIENT_SYNC_H_

#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/communicator.h"
#include "engine/optimizer.h"

namespace tandem::trainer {

// The rank groups of a job that share parameters (none owned; null: no such group).
struct RankGroups {
  // Every rank of the job: all hold every parameter that is not per expert.
  Communicator* data_parallel = nullptr;
  // Expert parallelism: the ranks that split the experts between them, and the ranks holding
  // the same experts as this one (null: no other).
  Communicator* expert_group = nullptr;
  Communicator* same_experts = nullptr;
};

// Gradient synchronization, the layer between the objective and the optimizer: each reduction
// runs over exactly the ranks that share what it reduces. A gradient of a parameter every rank
// holds is summed over all ranks; a per-expert one only over the ranks holding the same experts;
// the gradient norm adds every rank's own experts once. It knows no loss and no optimizer.
class GradientSync {
 public:
  // `per_expert` tells a per-expert parameter (held by some ranks only) from the others.
  GradientSync(RankGroups groups, std::function<bool(const engine::Param&)> per_expert);

  bool expert_parallel() const { return groups_.expert_group != nullptr; }

  // Sums `values` in place over all ranks (token counts, loss terms, statistics).
  absl::Status SumAcrossRanks(absl::Span<double> values) const;
  // Sums the gradients of `params` over the ranks that share each of them.
  absl::Status SumGradients(std::span<const engine::Param> params) const;
  // The L2 norm of every rank's gradients of `params`, the one gradient clipping needs.
  absl::StatusOr<double> GlobalGradNorm(std::span<const engine::Param> params) const;
  // The most `mine` of any rank of the expert group (`mine` without one): ranks of a group make
  // every pass together, so the one with fewer pads to the busiest.
  absl::StatusOr<int> MostInExpertGroup(int mine) const;

 private:
  struct SplitParams {
    std::vector<engine::Param> shared, per_expert;
  };
  SplitParams Split(std::span<const engine::Param> params) const;

  const RankGroups groups_;
  const std::function<bool(const engine::Param&)> per_expert_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_UPDATE_GRADIENT_SYNC_H_
