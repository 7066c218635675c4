#ifndef TANDEM_COMMON_PROCESS_MEMORY_H_
#define TANDEM_COMMON_PROCESS_MEMORY_H_

#include <fstream>
#include <string>

namespace tandem {

// Peak resident memory of this process (VmHWM), MiB; 0 where /proc is unavailable.
inline double PeakResidentMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_PROCESS_MEMORY_H_
