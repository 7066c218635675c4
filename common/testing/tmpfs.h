#ifndef TANDEM_COMMON_TESTING_TMPFS_H_
#define TANDEM_COMMON_TESTING_TMPFS_H_

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

namespace tandem::testing {

// A real small filesystem for full-disk tests: a tmpfs of `bytes` mounted at
// /tmp/tandem-tmpfs-<pid> for the object's life -- outside Bazel's trees, where a mount left
// behind breaks the next build -- and unmounted even when the test crashes (SIGABRT, SIGSEGV,
// SIGBUS). Mounting needs root (CAP_SYS_ADMIN) outside a sandbox; Mount says why not otherwise,
// so a test can skip. One at a time per process.
class Tmpfs {
 public:
  static std::optional<Tmpfs> Mount(int64_t bytes, std::string* why_not) {
    const std::string dir = "/tmp/tandem-tmpfs-" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    const std::string options = "size=" + std::to_string(bytes);
    if (mount("tandem-test", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      *why_not = "mounting a tmpfs at " + dir + ": " + std::strerror(errno) +
                 " (full-disk tests need root, outside a sandbox)";
      std::error_code ignored;
      std::filesystem::remove(dir, ignored);
      return std::nullopt;
    }
    std::snprintf(MountedDir(), kMaxDir, "%s", dir.c_str());
    for (const int signal : {SIGABRT, SIGSEGV, SIGBUS}) std::signal(signal, UnmountAndDie);
    return Tmpfs(dir);
  }
  Tmpfs(Tmpfs&& other) noexcept : dir_(std::exchange(other.dir_, "")) {}
  Tmpfs& operator=(Tmpfs&&) = delete;
  ~Tmpfs() {
    if (dir_.empty()) return;
    umount2(dir_.c_str(), MNT_DETACH);
    MountedDir()[0] = '\0';
    std::error_code ignored;
    std::filesystem::remove(dir_, ignored);
  }

  const std::string& dir() const { return dir_; }

  // Fills all but `keep_free` bytes with a file at `path` (under dir()); returns its size.
  int64_t Fill(const std::string& path, int64_t keep_free) const {
    const std::filesystem::space_info space = std::filesystem::space(dir_);
    const int64_t size = static_cast<int64_t>(space.available) - keep_free;
    std::ofstream file(path, std::ios::binary);
    const std::string block(1 << 16, 'x');
    for (int64_t written = 0; written < size; written += static_cast<int64_t>(block.size())) {
      file.write(block.data(),
                 static_cast<std::streamsize>(std::min<int64_t>(block.size(), size - written)));
    }
    return size;
  }

 private:
  explicit Tmpfs(std::string dir) : dir_(std::move(dir)) {}

  static constexpr size_t kMaxDir = 256;
  static char* MountedDir() {
    static char dir[kMaxDir] = "";
    return dir;
  }
  // Async-signal-safe: unmounts, then dies of the signal as the test would have.
  static void UnmountAndDie(int signal) {
    if (MountedDir()[0] != '\0') umount2(MountedDir(), MNT_DETACH);
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }

  std::string dir_;
};

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_TMPFS_H_
