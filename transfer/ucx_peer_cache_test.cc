// UcxPeerCache over real UCX workers (tcp on loopback): one endpoint per remote worker, kept
// between transfers and replaced when the remote or the local worker changes.
#include "transfer/ucx_peer_cache.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

std::unique_ptr<UcxWorker> Worker() { return *UcxWorker::Create({.transports = "tcp"}); }

// Fills `region` with `fill` through `peer`; true once the bytes are there.
bool PutLands(UcxPeer& peer, const UcxRegion& region, char fill) {
  std::string bytes(region.length(), fill);
  return peer.Put(region.packed_rkey(), {{region.remote_address(), bytes.data(), bytes.size()}},
                  absl::Now() + absl::Seconds(10))
             .ok() &&
         std::memcmp(region.data(), bytes.data(), bytes.size()) == 0;
}

TEST(UcxPeerCacheTest, KeepsOnePeerPerRemoteWorkerUntilForgotten) {
  const std::unique_ptr<UcxWorker> local = Worker();
  const std::unique_ptr<UcxWorker> remote = Worker();
  const std::unique_ptr<UcxWorker> other_remote = Worker();
  absl::StatusOr<std::unique_ptr<UcxRegion>> region = remote->Allocate(4096);
  ASSERT_TRUE(region.ok()) << region.status();
  UcxPeerCache peers;

  absl::StatusOr<UcxPeer*> first = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(PutLands(**first, **region, 'x'));
  absl::StatusOr<UcxPeer*> again = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);  // The same endpoint, its rkeys still unpacked.

  absl::StatusOr<UcxPeer*> elsewhere = peers.PeerFor(*local, other_remote->address());
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  peers.Forget();
  absl::StatusOr<UcxPeer*> fresh = peers.PeerFor(*local, remote->address());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(PutLands(**fresh, **region, 'y'));
}

// A kept peer meets region after region: it keeps at most kMaxCachedRkeys unpacked (each maps
// its region on shared memory), never dropping one the call in progress uses.
TEST(UcxPeerCacheTest, AKeptPeerBoundsItsUnpackedRkeys) {
  const std::unique_ptr<UcxWorker> local = Worker();
  const std::unique_ptr<UcxWorker> remote = Worker();
  constexpr size_t kRegions = UcxPeer::kMaxCachedRkeys + 6;
  std::vector<std::unique_ptr<UcxRegion>> regions;
  for (size_t i = 0; i < kRegions; ++i) regions.push_back(*remote->Allocate(4096));
  UcxPeerCache peers;
  UcxPeer& peer = **peers.PeerFor(*local, remote->address());
  std::vector<std::string> sources;
  std::vector<UcxPeer::RegionTransfers> all;
  for (size_t i = 0; i < kRegions; ++i) {
    sources.push_back(std::string(4096, static_cast<char>('a' + i % 26)));
  }
  std::vector<std::vector<UcxPeer::Transfer>> transfers(kRegions);
  for (size_t i = 0; i < kRegions; ++i) {
    transfers[i] = {{regions[i]->remote_address(), sources[i].data(), sources[i].size()}};
    all.push_back({regions[i]->packed_rkey(), transfers[i]});
  }
  // One call over more regions than the bound: none of its rkeys is dropped while it runs.
  ASSERT_TRUE(peer.Put(all, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_EQ(peer.cached_rkeys(), kRegions);
  for (size_t i = 0; i < kRegions; ++i) {
    EXPECT_EQ(std::memcmp(regions[i]->data(), sources[i].data(), 4096), 0) << "region " << i;
  }
  // Calls one region at a time: the least recently used go, and any region still works.
  for (size_t i = 0; i < kRegions; ++i) {
    ASSERT_TRUE(
        peer.Get(regions[i]->packed_rkey(), transfers[i], absl::Now() + absl::Seconds(10)).ok());
  }
  EXPECT_EQ(peer.cached_rkeys(), UcxPeer::kMaxCachedRkeys);
  std::string back(4096, 0);
  ASSERT_TRUE(peer.Get(regions[0]->packed_rkey(),
                       {{regions[0]->remote_address(), back.data(), 4096}},
                       absl::Now() + absl::Seconds(10))
                  .ok());
  EXPECT_EQ(back, sources[0]);
  EXPECT_EQ(peer.cached_rkeys(), UcxPeer::kMaxCachedRkeys);
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
