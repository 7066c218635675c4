#ifndef TANDEM_COMMON_PROCESS_STATUS_H_
#define TANDEM_COMMON_PROCESS_STATUS_H_

#include <fstream>
#include <string>

namespace tandem {

// The number after `field` (e.g. "VmHWM:") in /proc/self/status; 0 where it is unavailable.
inline double ProcessStatusField(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(field.size()));
  }
  return 0;
}

// Peak resident memory of this process (VmHWM), MiB.
inline double PeakResidentMiB() { return ProcessStatusField("VmHWM:") / 1024; }

// Threads of this process, as the kernel counts them.
inline int ProcessThreads() { return static_cast<int>(ProcessStatusField("Threads:")); }

}  // namespace tandem

#endif  // TANDEM_COMMON_PROCESS_STATUS_H_
