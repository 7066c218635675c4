#ifndef TANDEM_TESTS_SERVICE_PROCESS_H_
#define TANDEM_TESTS_SERVICE_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::testing {

// A Tandem service binary running as its own process, for multi-process tests. The process
// is killed (SIGKILL) when the object dies unless Stop() collected it first.
class ServiceProcess {
 public:
  // Starts `binary` with `args`; its stdout and stderr go to `log_path`.
  static absl::StatusOr<ServiceProcess> Start(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              const std::string& log_path);
  ServiceProcess(ServiceProcess&& other) noexcept;
  ServiceProcess& operator=(ServiceProcess&&) = delete;
  ~ServiceProcess();

  // Sends `signal` and waits for the exit; returns the wait status (see WIFEXITED).
  int Stop(int signal);
  // Waits for the process to exit on its own; returns the wait status.
  int Wait();

  pid_t pid() const { return pid_; }

 private:
  explicit ServiceProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

// Path of a binary built by Bazel and listed in the test's `data`.
std::string RunfilePath(const std::string& workspace_relative);

// A TCP port on 127.0.0.1 that was free a moment ago, drawn at random below the kernel's
// ephemeral range (ip_local_port_range, 32768 and up by default): a port the OS hands out
// (bind to 0) is also what any outgoing connection of a test running beside this one may take
// as its local port before the service binds it, which made process tests flake.
int PickFreePort();

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SERVICE_PROCESS_H_
