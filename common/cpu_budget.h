#ifndef TANDEM_COMMON_CPU_BUDGET_H_
#define TANDEM_COMMON_CPU_BUDGET_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace tandem {

// The CPUs this process may keep busy: the CPUs of its affinity mask, capped by its cgroup's
// CPU limit (a Kubernetes CPU limit), rounded up. std::thread::hardware_concurrency sees
// neither, so a pod limited to 2 CPUs on a 64-core node would start 64 BLAS threads.
int UsableCores();

// CPUs allowed by a cgroup v2 "cpu.max" line ("QUOTA PERIOD", or "max PERIOD" for no limit);
// nullopt for no limit or a malformed line.
std::optional<double> CgroupV2CpuLimit(absl::string_view cpu_max);

}  // namespace tandem

#endif  // TANDEM_COMMON_CPU_BUDGET_H_
