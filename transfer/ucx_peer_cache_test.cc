// UcxPeerCache over real UCX workers (tcp on loopback): one endpoint per remote worker, kept
// between transfers and replaced when the remote or the local worker changes.
#include "transfer/ucx_peer_cache.h"

#include <cstring>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

std::unique_ptr<UcxWorker> Worker() { return *UcxWorker::Create({.transports = "tcp"}); }

TEST(UcxPeerCacheTest, KeepsOnePeerPerRemoteWorkerUntilForgotten) {
  const std::unique_ptr<UcxWorker> local = Worker();
  const std::unique_ptr<UcxWorker> remote = Worker();
  const std::unique_ptr<UcxWorker> other_remote = Worker();
  absl::StatusOr<std::unique_ptr<UcxRegion>> region = remote->Allocate(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  UcxPeerCache peers;

  absl::StatusOr<UcxPeer*> first = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(first.ok()) << first.status();
  std::string bytes(4096, 'x');
  ASSERT_TRUE((*first)
                  ->Put((*region)->packed_rkey(),
                        {{(*region)->remote_address(), bytes.data(), bytes.size()}},
                        absl::Now() + absl::Seconds(10))
                  .ok());
  EXPECT_EQ(std::memcmp((*region)->data(), bytes.data(), bytes.size()), 0);
  absl::StatusOr<UcxPeer*> again = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);  // The same endpoint, its rkeys still unpacked.

  absl::StatusOr<UcxPeer*> elsewhere = peers.PeerFor(*local, other_remote->address());
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  peers.Forget();
  absl::StatusOr<UcxPeer*> fresh = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  bytes.assign(bytes.size(), 'y');
  EXPECT_TRUE((*fresh)
                  ->Put((*region)->packed_rkey(),
                        {{(*region)->remote_address(), bytes.data(), bytes.size()}},
                        absl::Now() + absl::Seconds(10))
                  .ok());
  EXPECT_EQ(std::memcmp((*region)->data(), bytes.data(), bytes.size()), 0);
}

TEST(UcxPeerCacheTest, ABadAddressIsAnErrorAndCachesNothing) {
  const std::unique_ptr<UcxWorker> local = Worker();
  UcxPeerCache peers;
  EXPECT_FALSE(peers.PeerFor(*local, "not a worker address").ok());
  const std::unique_ptr<UcxWorker> remote = Worker();
  EXPECT_TRUE(peers.PeerFor(*local, remote->address()).ok());
}

}  // namespace
}  // namespace tandem::transfer
