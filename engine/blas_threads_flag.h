#ifndef TANDEM_ENGINE_BLAS_THREADS_FLAG_H_
#define TANDEM_ENGINE_BLAS_THREADS_FLAG_H_

#include "absl/status/statusor.h"

namespace tandem::engine {

// Sets the OpenBLAS threads of a process computing with the engine from --blas_threads, logs
// and returns the count: the flag when > 0, else the usable cores (affinity and cgroup CPU
// limit) less one for the process's own threads (scheduler, gRPC, UCX progress), at least
// one. Left to itself OpenBLAS starts one spinning thread per core of the machine, which on
// two cores made rollout spend 42% of its time in sched_yield and its sampling
// nondeterministic. INVALID_ARGUMENT for a negative flag.
absl::StatusOr<int> ApplyBlasThreadsFlag();

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BLAS_THREADS_FLAG_H_
