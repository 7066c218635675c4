// Real UCX between two processes: each test forks a store process that exposes a region over
// its own worker, and reads/writes it from the test process. The store is forked before the
// test process creates any UCX worker, so the child inherits no UCX threads.
#include "transfer/ucx_transport.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

// Not a multiple of the chunk size, so the last chunk of a whole-region transfer is partial.
constexpr size_t kRegionBytes = (64 << 20) + 12345;
constexpr uint64_t kStoreSeed = 1;
constexpr absl::Duration kTimeout = absl::Seconds(10);

// A sequence without short periods, so that a misplaced chunk cannot match by accident.
void FillPattern(char* data, size_t size, uint64_t seed) {
  size_t words = size / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    std::memcpy(data + i * 8, &x, 8);
  }
  for (size_t i = words * 8; i < size; ++i) data[i] = static_cast<char>(i * 131 + seed);
}

std::vector<char> Pattern(size_t size, uint64_t seed) {
  std::vector<char> data(size);
  FillPattern(data.data(), size, seed);
  return data;
}

// Length-prefixed messages over one end of a socketpair.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel() { close(fd_); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  bool Send(absl::string_view message) {
    uint64_t size = message.size();
    return WriteAll(&size, sizeof(size)) && WriteAll(message.data(), message.size());
  }
  // nullopt once the other side is gone.
  std::optional<std::string> Receive() {
    uint64_t size;
    if (!ReadAll(&size, sizeof(size))) return std::nullopt;
    std::string message(size, '\0');
    if (!ReadAll(message.data(), size)) return std::nullopt;
    return message;
  }

 private:
  bool WriteAll(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = write(fd_, p, size);
      if (n <= 0) return false;
      p += n;
      size -= n;
    }
    return true;
  }
  bool ReadAll(void* data, size_t size) {
    char* p = static_cast<char*>(data);
    while (size > 0) {
      ssize_t n = read(fd_, p, size);
      if (n <= 0) return false;
      p += n;
      size -= n;
    }
    return true;
  }

  int fd_;
};

// The store process: exposes a region holding Pattern(size, kStoreSeed), sends its worker
// address, region address and rkey, then answers "verify <seed> <offset> <length>" (does the
// range hold that pattern?) until the test closes the channel.
int ServeStore(Channel& channel, const std::string& transports, size_t size, bool allocate) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = transports});
  if (!worker.ok()) return 2;
  std::vector<char> registered(allocate ? 0 : size);
  absl::StatusOr<std::unique_ptr<UcxRegion>> region =
      allocate ? (*worker)->Allocate(size) : (*worker)->Register(registered.data(), size);
  if (!region.ok()) return 3;
  FillPattern((*region)->data(), size, kStoreSeed);
  if (!channel.Send((*worker)->address()) ||
      !channel.Send(absl::StrCat((*region)->remote_address())) ||
      !channel.Send((*region)->packed_rkey())) {
    return 4;
  }
  while (std::optional<std::string> command = channel.Receive()) {
    std::vector<std::string> words = absl::StrSplit(*command, ' ');
    uint64_t seed, offset, length;
    if (words.size() != 4 || words[0] != "verify" || !absl::SimpleAtoi(words[1], &seed) ||
        !absl::SimpleAtoi(words[2], &offset) || !absl::SimpleAtoi(words[3], &length)) {
      return 5;
    }
    std::vector<char> expected = Pattern(size, seed);
    bool same = std::memcmp((*region)->data() + offset, expected.data() + offset, length) == 0;
    channel.Send(same ? "ok" : "mismatch");
  }
  return 0;
}

// A forked store process, as seen from the test.
class Store {
 public:
  Store(const std::string& transports, size_t size, bool allocate = true) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      Channel channel(fds[1]);
      _exit(ServeStore(channel, transports, size, allocate));
    }
    close(fds[1]);
    channel_.emplace(fds[0]);
    std::optional<std::string> address = channel_->Receive();
    std::optional<std::string> region = channel_->Receive();
    std::optional<std::string> rkey = channel_->Receive();
    if (address && region && rkey && absl::SimpleAtoi(*region, &region_address_)) {
      address_ = *address;
      rkey_ = *rkey;
    }
  }
  ~Store() { Stop(); }

  bool ok() const { return !address_.empty(); }
  const std::string& address() const { return address_; }
  uint64_t region_address() const { return region_address_; }
  const std::string& rkey() const { return rkey_; }

  bool Verify(uint64_t seed, size_t offset, size_t length) {
    return channel_->Send(absl::StrCat("verify ", seed, " ", offset, " ", length)) &&
           channel_->Receive() == "ok";
  }
  void Kill() {
    kill(pid_, SIGKILL);
    Stop();
  }
  // Closes the channel, which ends the store, and waits for it. True if it had not crashed.
  bool Stop() {
    channel_.reset();
    if (pid_ <= 0) return true;
    waitpid(pid_, &wait_status_, 0);
    pid_ = -1;
    return WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0;
  }
  // After Stop: whether the store died of SIGABRT, as a failed UCX assertion ends a process.
  bool Aborted() const { return WIFSIGNALED(wait_status_) && WTERMSIG(wait_status_) == SIGABRT; }

 private:
  pid_t pid_ = -1;
  int wait_status_ = 0;  // waitpid's, once stopped.
  std::optional<Channel> channel_;
  std::string address_;
  uint64_t region_address_ = 0;
  std::string rkey_;
};

// Shared memory only. posix and sysv map UCX-allocated regions into the peer (cma, which
// could reach any memory, is blocked by the ptrace restriction here); self is the loopback.
// UCX needs no tcp for wireup: the posix transport alone would do.
constexpr char kSharedMemory[] = "posix,sysv,self";

// Forks a store, then creates this process's worker and connects to it.
class UcxTransportFixture : public testing::Test {
 protected:
  void StartStore(const std::string& transports, size_t size, bool allocate = true) {
    store_.emplace(transports, size, allocate);
    ASSERT_TRUE(store_->ok());
    absl::StatusOr<std::unique_ptr<UcxWorker>> worker =
        UcxWorker::Create({.transports = transports});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    absl::StatusOr<std::unique_ptr<UcxPeer>> peer = worker_->Connect(store_->address());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *std::move(peer);
  }

  void TearDown() override {
    if (store_) {
      EXPECT_TRUE(store_->Stop()) << "the store process crashed";
    }
  }

  absl::Status Get(size_t offset, char* local, size_t length, absl::Duration timeout = kTimeout) {
    return peer_->Get(store_->rkey(), {{store_->region_address() + offset, local, length}},
                      absl::Now() + timeout);
  }
  absl::Status Put(size_t offset, char* local, size_t length) {
    return peer_->Put(store_->rkey(), {{store_->region_address() + offset, local, length}},
                      absl::Now() + kTimeout);
  }

  std::optional<Store> store_;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxPeer> peer_;
};

class UcxTransportTest : public UcxTransportFixture,
                         public testing::WithParamInterface<std::string> {
 protected:
  void StartStore(size_t size, bool allocate = true) {
    UcxTransportFixture::StartStore(GetParam(), size, allocate);
  }
};

using UcxTcpTest = UcxTransportFixture;

TEST_P(UcxTransportTest, GetReadsExactBytes) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  const std::vector<char> expected = Pattern(kRegionBytes, kStoreSeed);
  std::vector<char> local(kRegionBytes);
  struct Range {
    size_t offset, length;
  };
  for (Range range :
       {Range{0, 1}, Range{kRegionBytes - 1, 1}, Range{777, 1 << 20}, Range{0, kRegionBytes}}) {
    SCOPED_TRACE(absl::StrCat(range.length, " bytes at ", range.offset));
    std::fill(local.begin(), local.end(), 0);
    ASSERT_EQ(Get(range.offset, local.data(), range.length), absl::OkStatus());
    EXPECT_EQ(std::memcmp(local.data(), expected.data() + range.offset, range.length), 0);
  }
}

TEST_P(UcxTransportTest, GetGathersSeveralTransfersInOneCall) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  const std::vector<char> expected = Pattern(kRegionBytes, kStoreSeed);
  std::vector<char> first(3 << 20), second(5);
  const uint64_t base = store_->region_address();
  ASSERT_EQ(peer_->Get(store_->rkey(),
                       {{base + 10, first.data(), first.size()},
                        {base + kRegionBytes - 5, second.data(), second.size()}},
                       absl::Now() + kTimeout),
            absl::OkStatus());
  EXPECT_EQ(std::memcmp(first.data(), expected.data() + 10, first.size()), 0);
  EXPECT_EQ(std::memcmp(second.data(), expected.data() + kRegionBytes - 5, second.size()), 0);
}

// Reads of several regions in one window (here the store's one region named twice, as a fetch
// names each shard); a bad region anywhere in the list transfers nothing.
TEST_P(UcxTransportTest, GetOverSeveralRegionsReadsEachAndChecksAllFirst) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  const std::vector<char> expected = Pattern(kRegionBytes, kStoreSeed);
  const uint64_t base = store_->region_address();
  std::vector<char> first(1 << 20), second(4 << 20);
  const std::vector<UcxPeer::Transfer> first_reads = {{base + 3, first.data(), first.size()}};
  const std::vector<UcxPeer::Transfer> second_reads = {
      {base + kRegionBytes - second.size(), second.data(), second.size()}};
  ASSERT_EQ(peer_->Get({{store_->rkey(), first_reads}, {store_->rkey(), second_reads}},
                       absl::Now() + kTimeout),
            absl::OkStatus());
  EXPECT_EQ(std::memcmp(first.data(), expected.data() + 3, first.size()), 0);
  EXPECT_EQ(
      std::memcmp(second.data(), expected.data() + kRegionBytes - second.size(), second.size()), 0);

  std::fill(first.begin(), first.end(), 0);
  const std::vector<UcxPeer::Transfer> past_the_end = {{base + kRegionBytes - 1, second.data(), 2}};
  EXPECT_EQ(peer_
                ->Get({{store_->rkey(), first_reads}, {store_->rkey(), past_the_end}},
                      absl::Now() + kTimeout)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::count(first.begin(), first.end(), 0), static_cast<long>(first.size()));
}

TEST_P(UcxTransportTest, PutIsVisibleToTheStoreOnReturn) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  constexpr uint64_t kSeed = 7;
  std::vector<char> data = Pattern(kRegionBytes, kSeed);
  ASSERT_EQ(Put(5, data.data() + 5, 1), absl::OkStatus());
  EXPECT_TRUE(store_->Verify(kSeed, 5, 1));
  ASSERT_EQ(Put(4099, data.data() + 4099, 1 << 20), absl::OkStatus());
  EXPECT_TRUE(store_->Verify(kSeed, 4099, 1 << 20));
  ASSERT_EQ(Put(0, data.data(), kRegionBytes), absl::OkStatus());
  EXPECT_TRUE(store_->Verify(kSeed, 0, kRegionBytes));
}

// Writes of several regions in one window and one flush; a bad region anywhere in the list
// transfers nothing.
TEST_P(UcxTransportTest, PutOverSeveralRegionsIsVisibleOnReturnAndChecksAllFirst) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  constexpr uint64_t kSeed = 11;
  std::vector<char> data = Pattern(kRegionBytes, kSeed);
  const uint64_t base = store_->region_address();
  const std::vector<UcxPeer::Transfer> head = {{base, data.data(), 1 << 20}};
  const std::vector<UcxPeer::Transfer> tail = {
      {base + kRegionBytes - (3 << 20), data.data() + kRegionBytes - (3 << 20), 3 << 20}};
  const std::vector<UcxPeer::Transfer> past_the_end = {{base + kRegionBytes - 1, data.data(), 2}};
  EXPECT_EQ(
      peer_->Put({{store_->rkey(), head}, {store_->rkey(), past_the_end}}, absl::Now() + kTimeout)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Verify(kStoreSeed, 0, 1 << 20));

  ASSERT_EQ(peer_->Put({{store_->rkey(), head}, {store_->rkey(), tail}}, absl::Now() + kTimeout),
            absl::OkStatus());
  EXPECT_TRUE(store_->Verify(kSeed, 0, 1 << 20));
  EXPECT_TRUE(store_->Verify(kSeed, kRegionBytes - (3 << 20), 3 << 20));
  EXPECT_TRUE(store_->Verify(kStoreSeed, 1 << 20, kRegionBytes - (4 << 20)));
}

TEST_P(UcxTransportTest, ServesRegisteredMemory) {
  constexpr size_t kBytes = (4 << 20) + 3;
  ASSERT_NO_FATAL_FAILURE(StartStore(kBytes, /*allocate=*/false));
  const std::vector<char> expected = Pattern(kBytes, kStoreSeed);
  std::vector<char> local(kBytes);
  ASSERT_EQ(Get(0, local.data(), kBytes), absl::OkStatus());
  EXPECT_EQ(local, expected);
  std::vector<char> data = Pattern(kBytes, 9);
  ASSERT_EQ(Put(0, data.data(), kBytes), absl::OkStatus());
  EXPECT_TRUE(store_->Verify(9, 0, kBytes));
}

TEST_P(UcxTransportTest, RejectsBadRkeysAndAddressesThenStillWorks) {
  constexpr size_t kBytes = 1 << 20;
  ASSERT_NO_FATAL_FAILURE(StartStore(kBytes));
  std::vector<char> local(kBytes + 1);
  const uint64_t base = store_->region_address();
  const absl::Time deadline = absl::Now() + kTimeout;
  const std::string& rkey = store_->rkey();
  for (const std::string& bad_rkey : {std::string(), std::string(40, 'x'), rkey.substr(0, 20)}) {
    EXPECT_EQ(peer_->Get(bad_rkey, {{base, local.data(), 1}}, deadline).code(),
              absl::StatusCode::kInvalidArgument);
  }
  std::string foreign = rkey;
  foreign[16] ^= 1;  // The owner: as if the rkey came from another worker.
  std::string corrupt = rkey;
  corrupt.back() ^= 1;  // UCX's bytes, which the checksum covers.
  for (const std::string& bad_rkey : {foreign, corrupt}) {
    EXPECT_EQ(peer_->Get(bad_rkey, {{base, local.data(), 1}}, deadline).code(),
              absl::StatusCode::kInvalidArgument);
  }
  const std::vector<UcxPeer::Transfer> out_of_range = {{base - 1, local.data(), 1},
                                                       {base + kBytes, local.data(), 1},
                                                       {base, local.data(), kBytes + 1},
                                                       {base + 8, local.data(), ~uint64_t{0} - 4},
                                                       {base, nullptr, 1}};
  for (const UcxPeer::Transfer& transfer : out_of_range) {
    EXPECT_EQ(peer_->Get(rkey, {transfer}, deadline).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(peer_->Put(rkey, {transfer}, deadline).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Get(0, local.data(), kBytes), absl::OkStatus());
}

// Shared memory maps the store's region into this process: its bytes read in place, and they
// are the store's live memory (a later Put shows through). Nothing maps over tcp, nor memory
// the store registered rather than allocated through UCX.
TEST_P(UcxTransportTest, MapsTheRegionOnlyOverSharedMemory) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  const uint64_t base = store_->region_address();
  // Ranges and rkeys are checked before the transport is asked, on every transport.
  for (const auto& [offset, length] : {std::pair<int64_t, uint64_t>{-1, 1},
                                       {0, kRegionBytes + 1},
                                       {kRegionBytes, 1},
                                       {8, ~uint64_t{0} - 4}}) {
    EXPECT_EQ(peer_->Mapped(store_->rkey(), base + offset, length).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(peer_->Mapped(std::string(40, 'x'), base, 1).status().code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<const char*> mapped = peer_->Mapped(store_->rkey(), base + 5, kRegionBytes - 5);
  if (GetParam() == "tcp") {
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kUnimplemented) << mapped.status();
    return;
  }
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const std::vector<char> expected = Pattern(kRegionBytes, kStoreSeed);
  EXPECT_EQ(std::memcmp(*mapped, expected.data() + 5, kRegionBytes - 5), 0);
  std::vector<char> written = Pattern(1 << 20, 3);
  ASSERT_EQ(Put(5, written.data(), written.size()), absl::OkStatus());
  EXPECT_EQ(std::memcmp(*mapped, written.data(), written.size()), 0);
}

TEST_P(UcxTransportTest, RegisteredMemoryIsNotMapped) {
  ASSERT_NO_FATAL_FAILURE(StartStore(1 << 20, /*allocate=*/false));
  EXPECT_EQ(peer_->Mapped(store_->rkey(), store_->region_address(), 1 << 20).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Over tcp, UCX reports the peer's death. Over shared memory (UCX 1.13 has no peer failure
// detection there) the dead store's region stays mapped into this process, so a Get returns
// its last contents; it must still return, not hang.
TEST_P(UcxTransportTest, DeadPeerNeverHangs) {
  ASSERT_NO_FATAL_FAILURE(StartStore(kRegionBytes));
  std::vector<char> local(kRegionBytes);
  ASSERT_EQ(Get(0, local.data(), 1), absl::OkStatus());
  store_->Kill();
  const absl::Time start = absl::Now();
  absl::Status status = Get(0, local.data(), kRegionBytes);
  EXPECT_LT(absl::Now() - start, kTimeout);
  if (GetParam() == "tcp") {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_EQ(Get(0, local.data(), 1).code(), absl::StatusCode::kUnavailable);
  } else if (status.ok()) {
    EXPECT_EQ(local, Pattern(kRegionBytes, kStoreSeed));
  }
}

TEST_P(UcxTransportTest, ConnectToADeadPeerFails) {
  Store store(GetParam(), 1 << 20);
  ASSERT_TRUE(store.ok());
  store.Kill();
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = GetParam()});
  ASSERT_TRUE(worker.ok()) << worker.status();
  const absl::Time start = absl::Now();
  EXPECT_FALSE((*worker)->Connect(store.address()).ok());
  EXPECT_LT(absl::Now() - start, kTimeout);
}

TEST_P(UcxTransportTest, UsesTheRequestedTransports) {
  ASSERT_NO_FATAL_FAILURE(StartStore(1 << 20));
  const std::string lanes = peer_->DebugString();
  if (GetParam() == "tcp") {
    EXPECT_THAT(lanes, testing::HasSubstr("tcp/"));
  } else {
    EXPECT_THAT(lanes, testing::HasSubstr("sysv/memory"));
    EXPECT_THAT(lanes, testing::Not(testing::HasSubstr("tcp/")));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest,
                         testing::Values(std::string("tcp"), std::string(kSharedMemory)),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? "Tcp" : "SharedMemory";
                         });

TEST_F(UcxTcpTest, PeerDyingMidTransferFailsWithinDeadline) {
  ASSERT_NO_FATAL_FAILURE(StartStore("tcp", kRegionBytes));
  std::vector<char> local(kRegionBytes);
  std::thread killer([this] {
    absl::SleepFor(absl::Milliseconds(30));
    store_->Kill();
  });
  const absl::Time start = absl::Now();
  absl::Status status;
  while (status.ok() && absl::Now() - start < kTimeout) {
    status = Get(0, local.data(), kRegionBytes);
  }
  killer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST_F(UcxTcpTest, MissedDeadlineLeavesThePeerUsable) {
  ASSERT_NO_FATAL_FAILURE(StartStore("tcp", kRegionBytes));
  std::vector<char> local(kRegionBytes);
  EXPECT_EQ(Get(0, local.data(), kRegionBytes, absl::Milliseconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(Get(0, local.data(), kRegionBytes), absl::OkStatus());
  EXPECT_EQ(local, Pattern(kRegionBytes, kStoreSeed));
}

TEST_F(UcxTcpTest, StoreSurvivesClientsThatComeAndGo) {
  ASSERT_NO_FATAL_FAILURE(StartStore("tcp", 1 << 20));
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = "tcp"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    absl::StatusOr<std::unique_ptr<UcxPeer>> peer = (*worker)->Connect(store_->address());
    ASSERT_TRUE(peer.ok()) << peer.status();
  }
  // Clients that exit without closing anything, as a crash would.
  for (int i = 0; i < 10; ++i) {
    const pid_t client = fork();
    if (client == 0) {
      absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = "tcp"});
      _exit(worker.ok() && (*worker)->Connect(store_->address()).ok() ? 0 : 1);
    }
    int status = 0;
    waitpid(client, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_TRUE(store_->Verify(kStoreSeed, 0, 1 << 20));
}

// A store stopped right after a client connected over tcp and unpacked its rkey, before any
// transfer. The first rkey unpack sends UCX's wireup request (tcp RMA is emulated with active
// messages, which need the store's endpoint id), and the store's reply waits on the store's
// side until the tcp connection back to the client is acknowledged. UCX 1.13 aborts
// ucp_worker_destroy on a reply still waiting there (an assertion in
// ucp_request_send_state_ff), so a store stopped in that window, as in a rolling update,
// must finish the exchange first. A race: 20 stores, each a process of its own, and none may
// abort.
TEST(UcxShutdownTest, StoreStoppedRightAfterAClientConnectedExitsCleanly) {
  constexpr int kTries = 20;
  int aborted = 0;
  int failed = 0;
  for (int i = 0; i < kTries; ++i) {
    Store store("tcp", 1 << 20);  // Forked before this process creates its worker.
    ASSERT_TRUE(store.ok());
    absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = "tcp"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    absl::StatusOr<std::unique_ptr<UcxPeer>> peer = (*worker)->Connect(store.address());
    ASSERT_TRUE(peer.ok()) << peer.status();
    // Nothing maps over tcp, but the rkey is unpacked first, which starts the wireup exchange.
    EXPECT_EQ((*peer)->Mapped(store.rkey(), store.region_address(), 1).status().code(),
              absl::StatusCode::kUnimplemented);
    // The client stays up (and answers) while the store stops, as in a rolling update.
    if (!store.Stop()) {
      if (store.Aborted()) {
        ++aborted;
      } else {
        ++failed;
      }
    }
  }
  EXPECT_EQ(aborted, 0) << aborted << " of " << kTries << " stores aborted (SIGABRT) at shutdown";
  EXPECT_EQ(failed, 0) << failed << " of " << kTries << " stores failed otherwise at shutdown";
}

TEST(UcxWorkerTest, RejectsBadArguments) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Create({.transports = "tcp"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::unique_ptr<UcxWorker>> other = UcxWorker::Create({.transports = "tcp"});
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string& address = (*other)->address();
  std::string corrupt = address;
  corrupt.back() ^= 1;
  // Given to UCX, each of these would abort the process.
  for (const std::string& bad :
       {std::string(), std::string(64, 'x'), corrupt, address.substr(0, address.size() / 2)}) {
    EXPECT_EQ((*worker)->Connect(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ((*worker)->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*worker)->Register(nullptr, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(UcxWorker::Create({.transports = "no_such_transport"}).ok());
  EXPECT_FALSE(UcxWorker::Create({.transports = "tcp", .window = 0}).ok());
}

}  // namespace
}  // namespace tandem::transfer
