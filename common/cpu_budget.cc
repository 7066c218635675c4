#include "common/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

int AffinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  return std::max(1, CPU_COUNT(&set));
}

std::optional<double> CgroupCpuLimit() {
  std::ifstream cpu_max("/sys/fs/cgroup/cpu.max");  // cgroup v2, as a container sees it.
  std::string line;
  if (cpu_max && std::getline(cpu_max, line)) return CgroupV2CpuLimit(line);
  std::ifstream quota_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");  // cgroup v1.
  std::ifstream period_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  double quota = 0;
  double period = 0;
  if (quota_file >> quota && period_file >> period && quota > 0 && period > 0) {
    return quota / period;
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> CgroupV2CpuLimit(absl::string_view cpu_max) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(cpu_max, ' ', absl::SkipWhitespace());
  double quota = 0;
  double period = 0;
  if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &quota) ||
      !absl::SimpleAtod(fields[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;  // Includes "max PERIOD": no limit.
  }
  return quota / period;
}

int UsableCores() {
  const int affinity = AffinityCores();
  const std::optional<double> limit = CgroupCpuLimit();
  if (!limit) return affinity;
  return std::clamp(static_cast<int>(std::ceil(*limit)), 1, affinity);
}

}  // namespace tandem
