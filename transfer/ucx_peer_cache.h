#ifndef TANDEM_TRANSFER_UCX_PEER_CACHE_H_
#define TANDEM_TRANSFER_UCX_PEER_CACHE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transfer/ucx_transport.h"

namespace tandem::transfer {

// The endpoint to the remote worker last asked for, kept between transfers: a process that moves
// bytes to or from one remote worker again and again (a trainer publishing every step, a replica
// fetching every version) pays the wireup once, and the peer's unpacked rkeys keep the remote
// regions mapped where the transport maps them (shared memory), so later transfers into the
// same regions fault no pages in (a fresh mapping of 59 MiB costs ~15k page faults, several
// times the copy itself). Used by one thread at a time.
class UcxPeerCache {
 public:
  // The cached peer if it connects `ucx` to `remote_address`; else a new one, replacing it.
  absl::StatusOr<UcxPeer*> PeerFor(UcxWorker& ucx, absl::string_view remote_address);
  // Drops the peer, e.g. after a failed transfer: a broken endpoint is not reused.
  void Forget() { peer_.reset(); }

 private:
  UcxWorker* worker_ = nullptr;
  std::string address_;
  std::unique_ptr<UcxPeer> peer_;
};

}  // namespace tandem::transfer

#endif  // TANDEM_TRANSFER_UCX_PEER_CACHE_H_
