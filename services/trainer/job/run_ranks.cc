#include "services/trainer/job/run_ranks.h"

#include <utility>

#include "services/trainer/ranks/rank_agreement.h"

namespace tandem::trainer {

absl::Status RunRanks::Form(const internal::v1::GetAssignmentResponse& to_post, int ranks,
                            int expert_parallel, const RankMeeting& meeting,
                            const std::atomic<bool>& cancelled) {
  absl::StatusOr<std::unique_ptr<RankGroup>> group =
      lead() ? RankGroup::Lead(to_post, ranks, expert_parallel, meeting, cancelled)
             : RankGroup::Join(*member_store_, rank_, ranks, expert_parallel, meeting.gloo);
  if (!group.ok()) return group.status();
  group_ = *std::move(group);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> RunRanks::ExchangeExperts(const engine::ModelConfig& model) {
  auto exchange = engine::ExpertParallelExchange::Create(*group_->experts(), model.num_experts,
                                                         model.num_moe_layers());
  if (!exchange.ok()) return exchange.status();
  exchange_ = *std::move(exchange);
  absl::StatusOr<engine::LocalExperts> local = exchange_->local_experts(0);
  if (!local.ok()) return local.status();
  return local->experts;
}

PolicyUpdateConfig::ExpertParallelism RunRanks::ExpertGroups() {
  if (exchange_ == nullptr) return {};
  return {.exchange = exchange_.get(), .group = experts(), .same_experts = copies()};
}

RunRanks::ExchangeTotals RunRanks::Exchanged() {
  if (exchange_ == nullptr) return {};
  exchange_time_ += group_->experts()->TakeCounts().time;
  return {.seconds = absl::ToDoubleSeconds(exchange_time_),
          .bytes = exchange_->bytes_sent(),
          .rows = exchange_->rows_computed(),
          .compute_seconds = absl::ToDoubleSeconds(exchange_->compute_time())};
}

absl::Status RunRanks::Agree(const absl::Status& local, absl::string_view what,
                             absl::Duration timeout) {
  return ranks() == nullptr ? local : AgreeOnFailures(*ranks(), local, what, timeout);
}

}  // namespace tandem::trainer
