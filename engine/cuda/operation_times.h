#ifndef TANDEM_ENGINE_CUDA_OPERATION_TIMES_H_
#define TANDEM_ENGINE_CUDA_OPERATION_TIMES_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem::engine::cuda {

// Where a GPU engine's time goes, by operation: the wall time of each operation, waited for
// (so the waits themselves slow the passes down, and each operation's figure includes its
// launch). CudaModelOps keeps one when TANDEM_CUDA_PROFILE is set in the environment; the table
// goes to stderr when the engine is destroyed, largest total first.
class OperationTimes {
 public:
  void Add(const char* operation, double seconds) {
    Total& total = totals_[operation];
    total.seconds += seconds;
    ++total.calls;
  }

  ~OperationTimes() {
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double all = 0;
    for (const auto& [operation, total] : rows) all += total.seconds;
    std::fprintf(stderr, "operation times (each waited for): %.1f ms in all\n", all * 1e3);
    for (const auto& [operation, total] : rows) {
      std::fprintf(stderr, "  %-28s %8lld calls %10.2f ms %6.1f%%\n", operation.c_str(),
                   static_cast<long long>(total.calls), total.seconds * 1e3,
                   100 * total.seconds / all);
    }
  }

 private:
  struct Total {
    double seconds = 0;
    int64_t calls = 0;
  };
  absl::flat_hash_map<std::string, Total> totals_;
};

}  // namespace tandem::engine::cuda

#endif  // TANDEM_ENGINE_CUDA_OPERATION_TIMES_H_
