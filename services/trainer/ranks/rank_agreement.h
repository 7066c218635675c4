#ifndef TANDEM_SERVICES_TRAINER_RANK_AGREEMENT_H_
#define TANDEM_SERVICES_TRAINER_RANK_AGREEMENT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/communicator.h"
#include "engine/optimizer.h"
#include "engine/parameters.h"

// What a job's data-parallel ranks agree on between their collectives: who failed, whether they
// hold the same parameters, the state rank 0 starts them from. Every function is collective.
namespace tandem::trainer {

// Tells every rank which ranks failed `what` (their `local` status not OK). OK when none did;
// on a rank that failed, its own error; on the others ABORTED naming the ranks that failed. So a
// failure on one rank ends the step on all of them at the same point, instead of leaving the
// others waiting in their next collective until its timeout. Ranks that come from long work of
// their own (generating, riding out a store outage) are waited for up to `wait` (without one,
// up to the communicator's timeout).
absl::Status AgreeOnFailures(Communicator& ranks, const absl::Status& local, absl::string_view what,
                             std::optional<absl::Duration> wait = std::nullopt);

// Every rank's 64-bit digest (a checksum), in rank order.
absl::StatusOr<std::vector<uint64_t>> GatherDigests(Communicator& ranks, uint64_t mine);

// Which tensors CheckIdenticalParameters compares: all, or those that are not per expert (what
// every rank of an expert-parallel job holds alike).
enum class CompareTensors { kAll, kNotPerExpert };

// DATA_LOSS on every rank, naming the ranks whose parameters differ from rank 0's (XXH3 of every
// value in name order), after `step`: data-parallel ranks must take identical steps.
absl::Status CheckIdenticalParameters(Communicator& ranks, const engine::ParameterSet& parameters,
                                      int64_t step, CompareTensors which = CompareTensors::kAll);

// Named tensors <- rank 0's, on every rank; each rank's must have the same names and sizes.
absl::Status BroadcastTensors(Communicator& ranks,
                              std::map<std::string, std::vector<float>>& tensors);

// The optimizer's state (moments and update count) <- rank 0's, on every rank.
absl::Status BroadcastOptimizerState(Communicator& ranks, engine::AdamW& optimizer);

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_RANK_AGREEMENT_H_
