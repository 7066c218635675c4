#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SOURCE_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SOURCE_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/router_replay/client/route_source.h"

namespace tandem::router_replay::testing {

// A RouteSource that answers with what a test scripted and keeps what it was asked: every row
// of every sequence filled with `fill` (the last token's -1, as router-replay gives it), and
// `missing_entries` reported; or `error`.
class FakeRouteSource final : public RouteSource {
 public:
  struct Call {
    std::vector<ReplaySequence> sequences;
    ReplayFetchOptions options;
  };

  absl::StatusOr<ReplayRoutes> Fetch(absl::Span<const ReplaySequence> sequences,
                                     const ReplayFetchOptions& options) override {
    absl::MutexLock lock(&mutex_);
    calls_.push_back({std::vector<ReplaySequence>(sequences.begin(), sequences.end()), options});
    if (!error_.ok()) return error_;
    const int64_t ids_per_row = static_cast<int64_t>(options.moe_layers.size()) * options.top_k;
    ReplayRoutes routes;
    for (const ReplaySequence& sequence : sequences) {
      routes.routes.insert(routes.routes.end(), (sequence.num_tokens - 1) * ids_per_row, fill_);
      routes.routes.insert(routes.routes.end(), ids_per_row, -1);
    }
    routes.missing_entries = missing_entries_;
    return routes;
  }

  void Answer(int16_t fill, int64_t missing_entries) {
    absl::MutexLock lock(&mutex_);
    fill_ = fill;
    missing_entries_ = missing_entries;
  }
  void Fail(absl::Status error) {
    absl::MutexLock lock(&mutex_);
    error_ = std::move(error);
  }
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mutex_);
    return calls_;
  }

 private:
  mutable absl::Mutex mutex_;
  int16_t fill_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t missing_entries_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mutex_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::router_replay::testing

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SOURCE_H_
