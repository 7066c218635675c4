// Get and Put throughput of UcxPeer against a forked store process holding one region of
// --bytes, over --transports. Prints one line per operation.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "transfer/ucx_transport.h"

ABSL_FLAG(uint64_t, bytes, 64 << 20, "Size of the store's region, moved whole by each operation.");
ABSL_FLAG(std::string, transports, "tcp", "UCX transports (as UCX_TLS).");
ABSL_FLAG(int, iterations, 5, "Timed operations per kind, after one untimed warm-up.");
ABSL_FLAG(uint64_t, chunk_kib, 256, "UcxOptions::max_chunk_bytes, in KiB.");
ABSL_FLAG(int, window, tandem::transfer::UcxOptions{}.window, "UcxOptions::window.");
ABSL_FLAG(bool, print_lanes, false, "Print the endpoint's transports and lanes.");

namespace tandem::transfer {
namespace {

UcxOptions Options() {
  return {.transports = absl::GetFlag(FLAGS_transports),
          .max_chunk_bytes = absl::GetFlag(FLAGS_chunk_kib) << 10,
          .max_get_chunk_bytes = absl::GetFlag(FLAGS_chunk_kib) << 10,
          .window = absl::GetFlag(FLAGS_window)};
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  for (ssize_t n; size > 0; p += n, size -= n) {
    if ((n = write(fd, p, size)) <= 0) return false;
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  for (ssize_t n; size > 0; p += n, size -= n) {
    if ((n = read(fd, p, size)) <= 0) return false;
  }
  return true;
}

bool SendString(int fd, const std::string& s) {
  uint64_t size = s.size();
  return WriteAll(fd, &size, sizeof(size)) && WriteAll(fd, s.data(), s.size());
}

bool ReceiveString(int fd, std::string* s) {
  uint64_t size;
  if (!ReadAll(fd, &size, sizeof(size))) return false;
  s->resize(size);
  return ReadAll(fd, s->data(), size);
}

// The store: sends its worker address, the region's address and rkey, then serves until the
// benchmark closes the socket.
int Serve(int fd) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create(Options());
  if (!worker.ok()) return 2;
  absl::StatusOr<std::unique_ptr<UcxRegion>> region =
      (*worker)->Allocate(absl::GetFlag(FLAGS_bytes));
  if (!region.ok()) return 3;
  std::fill_n((*region)->data(), (*region)->length(), 'w');
  const uint64_t address = (*region)->remote_address();
  if (!SendString(fd, (*worker)->address()) || !WriteAll(fd, &address, sizeof(address)) ||
      !SendString(fd, (*region)->packed_rkey())) {
    return 4;
  }
  char byte;
  while (read(fd, &byte, 1) > 0) {
  }
  return 0;
}

void Measure(const char* name, UcxPeer& peer, const std::string& rkey,
             const std::vector<UcxPeer::Transfer>& whole, bool put) {
  const size_t bytes = whole[0].length;
  const int iterations = absl::GetFlag(FLAGS_iterations);
  double best = 0, total_seconds = 0;
  for (int i = -1; i < iterations; ++i) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + absl::Minutes(1);
    absl::Status status = put ? peer.Put(rkey, whole, deadline) : peer.Get(rkey, whole, deadline);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!status.ok()) {
      std::printf("%s failed: %s\n", name, status.ToString().c_str());
      return;
    }
    if (i < 0) continue;  // Warm-up: wireup and rkey unpacking.
    total_seconds += seconds;
    best = std::max(best, bytes / seconds / 1e6);
  }
  std::printf("%s transports=%s bytes=%zu chunk=%zuKiB window=%d: %.0f MB/s mean, %.0f best\n",
              name, Options().transports.c_str(), bytes, Options().max_chunk_bytes >> 10,
              Options().window, bytes * iterations / total_seconds / 1e6, best);
}

int Run() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(Serve(fds[1]));
  }
  close(fds[1]);
  std::string address, rkey;
  uint64_t region;
  if (!ReceiveString(fds[0], &address) || !ReadAll(fds[0], &region, sizeof(region)) ||
      !ReceiveString(fds[0], &rkey)) {
    std::fprintf(stderr, "store process failed to start\n");
    return 1;
  }
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create(Options());
  if (!worker.ok()) {
    std::fprintf(stderr, "%s\n", worker.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<UcxPeer>> peer = (*worker)->Connect(address);
  if (!peer.ok()) {
    std::fprintf(stderr, "%s\n", peer.status().ToString().c_str());
    return 1;
  }
  std::vector<char> local(absl::GetFlag(FLAGS_bytes), 'c');
  const std::vector<UcxPeer::Transfer> whole = {{region, local.data(), local.size()}};
  Measure("get", **peer, rkey, whole, /*put=*/false);
  Measure("put", **peer, rkey, whole, /*put=*/true);
  if (absl::GetFlag(FLAGS_print_lanes)) std::printf("%s", (*peer)->DebugString().c_str());
  peer->reset();
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return 0;
}

}  // namespace
}  // namespace tandem::transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::transfer::Run();
}
