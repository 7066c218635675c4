#include "tests/service_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace tandem::testing {

absl::StatusOr<ServiceProcess> ServiceProcess::Start(const std::string& binary,
                                                     const std::vector<std::string>& args,
                                                     const std::string& log_path) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(error)));
  }
  return ServiceProcess(pid);
}

ServiceProcess::ServiceProcess(ServiceProcess&& other) noexcept : pid_(other.pid_) {
  other.pid_ = 0;
}

ServiceProcess::~ServiceProcess() {
  if (pid_ > 0) Stop(SIGKILL);
}

int ServiceProcess::Stop(int signal) {
  kill(pid_, signal);
  return Wait();
}

int ServiceProcess::Wait() {
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = 0;
  return status;
}

std::string RunfilePath(const std::string& workspace_relative) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/tandem/", workspace_relative);
}

int PickFreePort() {
  constexpr int kFirst = 20000, kLast = 32000;  // Below the ephemeral range.
  static std::mt19937 rng(std::random_device{}());
  while (true) {
    const int port = std::uniform_int_distribution<int>(kFirst, kLast)(rng);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    if (free) return port;
  }
}

}  // namespace tandem::testing
