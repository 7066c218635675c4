#include "services/rollout/relay_upstream.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status.h"

namespace tandem::rollout {

absl::StatusOr<std::string> RelayUpstream(absl::string_view relay_from, int replica_index) {
  constexpr absl::string_view kPrevious = "{previous}";
  if (!absl::StrContains(relay_from, kPrevious)) return std::string(relay_from);
  if (replica_index < 0) {
    return InvalidRequest(
        "INVALID_FLAG",
        absl::StrCat("--relay_from=", relay_from,
                     " names the previous replica: it needs "
                     "--replica_index (this replica's place in the chain, 0 for the first)"));
  }
  if (replica_index == 0) return std::string();
  return absl::StrReplaceAll(relay_from, {{kPrevious, absl::StrCat(replica_index - 1)}});
}

}  // namespace tandem::rollout
