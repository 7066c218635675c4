#include "services/trainer/ranks/rank_agreement.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"

namespace tandem::trainer {
namespace {

// A 64-bit digest as four 16-bit pieces: floats carry integers below 2^24 exactly.
constexpr int kDigestPieces = 4;

uint64_t ParameterDigest(const engine::ParameterSet& parameters, CompareTensors which) {
  Xxh3Hasher hasher;
  for (const std::string& name : parameters.names()) {
    const engine::Parameter& parameter = *parameters.Find(name);
    if (which == CompareTensors::kNotPerExpert && parameter.stacked_experts) continue;
    const std::vector<float>& values = parameter.value;
    hasher.Update(absl::string_view(reinterpret_cast<const char*>(values.data()),
                                    values.size() * sizeof(float)));
  }
  return hasher.Digest();
}

}  // namespace

absl::Status AgreeOnFailures(Communicator& ranks, const absl::Status& local, absl::string_view what,
                             std::optional<absl::Duration> wait) {
  const float failed = local.ok() ? 0.0f : 1.0f;
  absl::StatusOr<std::vector<float>> gathered = GatherFromRanks(ranks, {&failed, 1}, wait);
  if (!gathered.ok()) {
    return local.ok() ? gathered.status() : local;
  }
  if (!local.ok()) return local;
  std::vector<int> failing;
  for (int r = 0; r < ranks.size(); ++r) {
    if ((*gathered)[r] != 0) failing.push_back(r);
  }
  if (failing.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("trainer rank", failing.size() > 1 ? "s " : " ",
                                         absl::StrJoin(failing, ", "), " failed ", what,
                                         " (its log says why)"));
}

absl::StatusOr<std::vector<uint64_t>> GatherDigests(Communicator& ranks, uint64_t mine) {
  float pieces[kDigestPieces];
  for (int i = 0; i < kDigestPieces; ++i) {
    pieces[i] = static_cast<float>((mine >> (16 * i)) & 0xffff);
  }
  absl::StatusOr<std::vector<float>> gathered = GatherFromRanks(ranks, pieces);
  if (!gathered.ok()) return gathered.status();
  std::vector<uint64_t> digests(ranks.size(), 0);
  for (int r = 0; r < ranks.size(); ++r) {
    for (int i = 0; i < kDigestPieces; ++i) {
      digests[r] |= static_cast<uint64_t>((*gathered)[r * kDigestPieces + i]) << (16 * i);
    }
  }
  return digests;
}

absl::Status CheckIdenticalParameters(Communicator& ranks, const engine::ParameterSet& parameters,
                                      int64_t step, CompareTensors which) {
  absl::StatusOr<std::vector<uint64_t>> digests =
      GatherDigests(ranks, ParameterDigest(parameters, which));
  if (!digests.ok()) return digests.status();
  std::vector<int> differing;
  for (int r = 1; r < ranks.size(); ++r) {
    if ((*digests)[r] != (*digests)[0]) differing.push_back(r);
  }
  if (differing.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("after step ", step, " the parameters of trainer rank",
                   differing.size() > 1 ? "s " : " ", absl::StrJoin(differing, ", "),
                   " differ from rank 0's: data-parallel ranks must take identical steps"));
}

absl::Status BroadcastTensors(Communicator& ranks,
                              std::map<std::string, std::vector<float>>& tensors) {
  std::vector<float> packed;
  for (const auto& [name, values] : tensors)
    packed.insert(packed.end(), values.begin(), values.end());
  if (absl::Status status =
          ranks.Broadcast(packed.data(), static_cast<int64_t>(packed.size()), /*root=*/0);
      !status.ok()) {
    return status;
  }
  const float* next = packed.data();
  for (auto& [name, values] : tensors) {
    std::copy(next, next + values.size(), values.begin());
    next += values.size();
  }
  return absl::OkStatus();
}

absl::Status BroadcastOptimizerState(Communicator& ranks, engine::AdamW& optimizer) {
  engine::AdamWState state = optimizer.ExportState();
  float step = static_cast<float>(state.step);  // Exact below 2^24 updates.
  if (absl::Status status = ranks.Broadcast(&step, 1, /*root=*/0); !status.ok()) return status;
  if (absl::Status status = BroadcastTensors(ranks, state.tensors); !status.ok()) return status;
  state.step = static_cast<int64_t>(step);
  return optimizer.ImportState(state);
}

}  // namespace tandem::trainer
