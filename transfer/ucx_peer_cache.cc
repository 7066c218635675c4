#include "transfer/ucx_peer_cache.h"

#include <utility>

namespace tandem::transfer {

absl::StatusOr<UcxPeer*> UcxPeerCache::PeerFor(UcxWorker& ucx, absl::string_view remote_address) {
  if (peer_ == nullptr || worker_ != &ucx || address_ != remote_address) {
    peer_.reset();  // Closed before its replacement connects.
    absl::StatusOr<std::unique_ptr<UcxPeer>> peer = ucx.Connect(remote_address);
    if (!peer.ok()) return peer.status();
    peer_ = *std::move(peer);
    worker_ = &ucx;
    address_ = std::string(remote_address);
  }
  return peer_.get();
}

}  // namespace tandem::transfer
