#include "engine/blas_threads_flag.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "common/cpu_budget.h"
#include "common/logging.h"
#include "kernels/cpu/gemm.h"

ABSL_FLAG(int, blas_threads, 0,
          "OpenBLAS threads; 0: the usable cores (CPU affinity and cgroup limit) minus one, at "
          "least 1.");

namespace tandem::engine {

absl::StatusOr<int> ApplyBlasThreadsFlag() {
  const int requested = absl::GetFlag(FLAGS_blas_threads);
  if (requested < 0) return absl::InvalidArgumentError("--blas_threads must be >= 0");
  const int usable = UsableCores();
  const int threads = requested > 0 ? requested : std::max(1, usable - 1);
  cpu::SetBlasThreads(threads);
  spdlog::info("OpenBLAS threads: {} ({} usable cores)", threads, usable);
  return threads;
}

}  // namespace tandem::engine
