#include "engine/expert_parallel_exchange.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/buffer_access.h"

namespace tandem::engine {
namespace {

// Row counts travel as floats (the communicator's element type), exact up to 2^24.
constexpr int64_t kMaxExactCount = int64_t{1} << 24;

// Floats each rank sends (`sent`) or receives (the sum of its per-expert counts), for rows of
// `width` floats.
std::vector<int64_t> SentFloats(const ExchangePlan& plan, int width) {
  std::vector<int64_t> floats;
  for (int64_t rows : plan.sent_to_rank) floats.push_back(rows * width);
  return floats;
}

std::vector<int64_t> ReceivedFloats(const ExchangePlan& plan, int ranks, int width) {
  const int local = static_cast<int>(plan.received.size()) / ranks;
  std::vector<int64_t> floats(ranks, 0);
  for (int source = 0; source < ranks; ++source) {
    for (int i = 0; i < local; ++i) floats[source] += plan.received[source * local + i] * width;
  }
  return floats;
}

// Copies rows between the order Dispatch is given them in and the order they travel in, run by
// run (ExchangePlan::outgoing).
void Reorder(const ExchangePlan& plan, int width, const float* from, float* to, bool to_travel) {
  int64_t travel_row = 0;
  for (const ExchangePlan::RowRun& run : plan.outgoing) {
    const int64_t from_row = to_travel ? run.first : travel_row;
    const int64_t to_row = to_travel ? travel_row : run.first;
    std::copy_n(from + from_row * width, run.count * width, to + to_row * width);
    travel_row += run.count;
  }
}

// Moves rows between the order they travel in (by source rank, then local expert) and the order
// the experts compute them in (by local expert, then source rank).
void Regroup(const ExchangePlan& plan, int ranks, int width, const float* from, float* to,
             bool into_expert_order) {
  const int local = static_cast<int>(plan.local_offsets.size()) - 1;
  std::vector<int64_t> expert_row(plan.local_offsets.begin(), plan.local_offsets.end() - 1);
  int64_t travel_row = 0;
  for (int source = 0; source < ranks; ++source) {
    for (int i = 0; i < local; ++i) {
      const int64_t rows = plan.received[source * local + i];
      const int64_t from_row = into_expert_order ? travel_row : expert_row[i];
      const int64_t to_row = into_expert_order ? expert_row[i] : travel_row;
      std::copy_n(from + from_row * width, rows * width, to + to_row * width);
      expert_row[i] += rows;
      travel_row += rows;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> ExpertParallelExchange::Create(
    Communicator& group, int num_experts, int moe_layers) {
  if (num_experts < 1 || num_experts % group.size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(num_experts, " experts do not split evenly ",
                                                   "among ", group.size(),
                                                   " expert-parallel ranks"));
  }
  return Create(group, num_experts,
                placement::LayerPlacements::Uniform(
                    placement::ExpertPlacement::Contiguous(num_experts, group.size()), moe_layers));
}

absl::StatusOr<std::unique_ptr<ExpertParallelExchange>> ExpertParallelExchange::Create(
    Communicator& group, int num_experts, placement::LayerPlacements placements) {
  if (absl::Status status = placement::ValidatePlacements(
          placements, num_experts, group.size(), static_cast<int>(placements.layers.size()));
      !status.ok()) {
    return status;
  }
  return std::unique_ptr<ExpertParallelExchange>(
      new ExpertParallelExchange(group, num_experts, std::move(placements)));
}

absl::Status ExpertParallelExchange::SetPlacements(placement::LayerPlacements placements) {
  if (absl::Status status = placement::ValidatePlacements(placements, num_experts_, group_.size(),
                                                          static_cast<int>(layers_.size()));
      !status.ok()) {
    return status;
  }
  placements_ = std::move(placements);
  Derive();
  return absl::OkStatus();
}

void ExpertParallelExchange::Derive() {
  const placement::ExpertPlacement contiguous =
      placement::ExpertPlacement::Contiguous(num_experts_, group_.size());
  layers_.clear();
  for (const placement::ExpertPlacement& placement : placements_.layers) {
    Layer& layer = layers_.emplace_back();
    layer.slots = placement.Slots();
    layer.copies = placement.Copies();
    for (int rank = 0; rank < placement.ranks(); ++rank) {
      layer.computed.push_back(placement.Computed(rank));
    }
    layer.contiguous = placement == contiguous;
  }
}

absl::StatusOr<LocalExperts> ExpertParallelExchange::local_experts(int moe_layer) const {
  if (moe_layer < 0 || moe_layer >= static_cast<int>(layers_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer ", moe_layer, " of an exchange for ", layers_.size()));
  }
  return LocalExperts{.experts = layers_[moe_layer].computed[group_.rank()]};
}

absl::StatusOr<ExchangePlan> ExpertParallelExchange::Plan(int moe_layer,
                                                          const std::vector<int>& expert_offsets) {
  if (absl::Status status = local_experts(moe_layer).status(); !status.ok()) return status;
  if (absl::Status status = CheckExpertOffsets(expert_offsets, num_experts_); !status.ok()) {
    return status;
  }
  for (int e = 0; e < num_experts_; ++e) {
    const int64_t rows = expert_offsets[e + 1] - expert_offsets[e];
    if (rows > kMaxExactCount) {
      return absl::InvalidArgumentError(absl::StrCat("expert slot ", e, " has ", rows,
                                                     " rows in one layer; at most ", kMaxExactCount,
                                                     " can be dispatched"));
    }
  }
  const Layer& layer = layers_[moe_layer];
  const placement::ExpertPlacement& layout = placements_.layers[moe_layer];
  // What this rank sends each rank: for each expert that rank computes, this rank's rows of it
  // (or, for a replicated expert, that copy's piece of them).
  const int ranks = group_.size();
  ExchangePlan plan;
  plan.sent_to_rank.assign(ranks, 0);
  std::vector<float> counts;
  std::vector<int64_t> send_counts(ranks),
      receive_counts(ranks, layer.computed[group_.rank()].size());
  for (int rank = 0; rank < ranks; ++rank) {
    send_counts[rank] = static_cast<int64_t>(layer.computed[rank].size());
    for (int expert : layer.computed[rank]) {
      const std::vector<int>& copies = layer.copies[expert];
      const int copy =
          static_cast<int>(std::find(copies.begin(), copies.end(), rank) - copies.begin());
      const int first = expert_offsets[layer.slots[expert]];
      const placement::ExpertPlacement::RowPiece piece =
          layout.PieceOf(expert, copy, static_cast<int>(copies.size()),
                         expert_offsets[layer.slots[expert] + 1] - first);
      counts.push_back(static_cast<float>(piece.count));
      plan.sent_to_rank[rank] += piece.count;
      if (layout.has_replicas()) plan.outgoing.push_back({first + piece.first, piece.count});
    }
  }
  std::vector<float> received(static_cast<size_t>(ranks) * layer.computed[group_.rank()].size());
  if (absl::Status status =
          group_.AllToAllV(counts.data(), send_counts, received.data(), receive_counts);
      !status.ok()) {
    return status;
  }
  plan.received.assign(received.begin(), received.end());
  const int local = static_cast<int>(layer.computed[group_.rank()].size());
  plan.local_offsets.assign(local + 1, 0);
  for (int i = 0; i < local; ++i) {
    int64_t rows = 0;
    for (int source = 0; source < ranks; ++source) rows += plan.received[source * local + i];
    plan.local_offsets[i + 1] = plan.local_offsets[i] + static_cast<int>(rows);
  }
  return plan;
}

absl::Status ExpertParallelExchange::Dispatch(const ExchangePlan& plan, int width,
                                              Buffer<float>& rows, ModelOps& ops) {
  const int ranks = group_.size();
  const std::vector<int64_t> sent = SentFloats(plan, width);
  if (rows.size() != std::accumulate(sent.begin(), sent.end(), int64_t{0})) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatching ", rows.size(), " floats; the plan sends ",
                     std::accumulate(sent.begin(), sent.end(), int64_t{0})));
  }
  if (!plan.outgoing.empty()) {
    Buffer<float> leaving = ops.Allocate<float>(rows.size());
    Reorder(plan, width, BufferAccess::Address(rows.ref()), BufferAccess::Address(leaving.ref()),
            /*to_travel=*/true);
    std::swap(rows, leaving);
  }
  Buffer<float> arrived = ops.Allocate<float>(int64_t{plan.local_offsets.back()} * width);
  if (absl::Status status = group_.AllToAllV(BufferAccess::Address(rows.ref()), sent,
                                             BufferAccess::Address(arrived.ref()),
                                             ReceivedFloats(plan, ranks, width));
      !status.ok()) {
    return status;
  }
  CountSent(sent);
  rows_computed_ += plan.local_offsets.back();
  ops.Resize(rows, arrived.size());
  Regroup(plan, ranks, width, BufferAccess::Address(arrived.ref()),
          BufferAccess::Address(rows.ref()), /*into_expert_order=*/true);
  dispatched_ = absl::Now();
  return absl::OkStatus();
}

void ExpertParallelExchange::CountSent(const std::vector<int64_t>& counts) {
  for (int rank = 0; rank < group_.size(); ++rank) {
    if (rank != group_.rank()) bytes_sent_ += counts[rank] * int64_t{sizeof(float)};
  }
}

absl::Status ExpertParallelExchange::Combine(const ExchangePlan& plan, int width,
                                             Buffer<float>& rows, ModelOps& ops) {
  compute_time_ += absl::Now() - dispatched_;
  const int ranks = group_.size();
  Buffer<float> leaving = ops.Allocate<float>(rows.size());
  Regroup(plan, ranks, width, BufferAccess::Address(rows.ref()),
          BufferAccess::Address(leaving.ref()), /*into_expert_order=*/false);
  const std::vector<int64_t> sent = SentFloats(plan, width);
  const std::vector<int64_t> returned = ReceivedFloats(plan, ranks, width);
  ops.Resize(rows, std::accumulate(sent.begin(), sent.end(), int64_t{0}));
  if (absl::Status status = group_.AllToAllV(BufferAccess::Address(leaving.ref()), returned,
                                             BufferAccess::Address(rows.ref()), sent);
      !status.ok()) {
    return status;
  }
  CountSent(returned);
  if (!plan.outgoing.empty()) {  // Back from travel order to the order Dispatch was given.
    ops.Resize(leaving, rows.size());
    Reorder(plan, width, BufferAccess::Address(rows.ref()), BufferAccess::Address(leaving.ref()),
            /*to_travel=*/false);
    std::swap(rows, leaving);
  }
  return absl::OkStatus();
}

}  // namespace tandem::engine
