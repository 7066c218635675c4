// One-sided transfers between weight-store processes over UCX (UCP RMA): a store process
// exposes registered shard buffers (UcxRegion) and a client reads or writes them through an
// endpoint (UcxPeer) without the store's CPU copying data, except where the transport (tcp)
// emulates RMA in software, which the store's progress thread serves.
#ifndef TANDEM_TRANSFER_UCX_TRANSPORT_H_
#define TANDEM_TRANSFER_UCX_TRANSPORT_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tandem::transfer {

struct UcxOptions {
  // Transports, as UCX_TLS (e.g. "tcp", "posix,sysv,self"); empty: UCX's default selection.
  // The UCX_TLS environment variable, when set, wins over this field.
  std::string transports;
  // Largest single put. Large puts over tcp collapse (~26 MB/s at 64 MiB on these machines).
  size_t max_chunk_bytes = 256 << 10;
  // Largest single get: tcp gets grow faster with size (~600 MB/s at 256 KiB, ~1.5 GB/s at
  // 64 MiB here), and shared memory does not care.
  size_t max_get_chunk_bytes = 64 << 20;
  // Outstanding operations per Get/Put call. Deeper than 16 pays on tcp (ucx_transport_bench,
  // 3 runs: Get 1440-1510 vs 1320-1430 MB/s, Put 1090-1290 vs 990-1110; weight-store fetches
  // 6-22% faster).
  int window = 64;
};

class UcxRegion;
class UcxPeer;

namespace ucx_internal {
class Core;
class RequestWindow;
}  // namespace ucx_internal

// One UCP context and worker (thread mode MULTI), progressed by its own event-driven thread.
// Regions and peers share ownership of the context, worker and thread, so UCX resources are
// released in the right order whatever the order of destruction: the thread stops, and the
// worker and context are destroyed, when the last of this object and its regions and peers is.
// Before that, the worker finishes the connection handshakes (UCX wireup) peers started, for
// at most 2 s: UCX 1.13 aborts the process if a worker is destroyed in the middle of one.
class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options);
  ~UcxWorker();

  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // Packed worker address (ucp_worker_get_address), framed with a checksum, for a peer's
  // Connect.
  const std::string& address() const { return address_; }

  // Allocates `length` bytes registered for remote access. UCX allocates them (ucp_mem_map
  // ALLOCATE) so that shared-memory transports can map them into a peer.
  absl::StatusOr<std::unique_ptr<UcxRegion>> Allocate(size_t length);
  // Registers existing memory; the caller keeps it alive longer than the region.
  absl::StatusOr<std::unique_ptr<UcxRegion>> Register(void* data, size_t length);
  // Endpoint to a remote worker address (a peer's address()), INVALID_ARGUMENT if malformed;
  // returns once connected (UNAVAILABLE or DEADLINE_EXCEEDED after 10 s if it cannot be).
  // Uses UCX's PEER error handling, so a dead peer makes transfers fail instead of hang,
  // wherever the transports support it. tcp does; UCX 1.13's shared memory does not, and
  // there a dead store's region stays mapped: Get returns its last contents, Put is lost.
  absl::StatusOr<std::unique_ptr<UcxPeer>> Connect(absl::string_view remote_address);

 private:
  UcxWorker(std::shared_ptr<ucx_internal::Core> core, std::string address);
  absl::StatusOr<std::unique_ptr<UcxRegion>> Map(void* data, size_t length, bool allocate);

  std::shared_ptr<ucx_internal::Core> core_;
  std::string address_;
};

// Memory registered with a worker's context. Its packed_rkey() is what a peer needs, besides
// the worker address, to read and write it.
class UcxRegion {
 public:
  ~UcxRegion();  // Unmaps (and frees, when allocated by UCX).

  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  char* data() const { return data_; }
  size_t length() const { return length_; }
  uint64_t remote_address() const { return reinterpret_cast<uintptr_t>(data_); }
  // ucp_rkey_pack's output framed with a checksum, the owning worker and the region's bounds.
  // The bounds let a peer reject out-of-range transfers: UCX does not check them, and a stray
  // address would crash the store (tcp emulates RMA with a memcpy there) or the client
  // (shared memory). The owner rejects rkeys of another worker, e.g. of a restarted store.
  const std::string& packed_rkey() const { return packed_rkey_; }

 private:
  friend class UcxWorker;
  UcxRegion(std::shared_ptr<ucx_internal::Core> core, ucp_mem_h memh, char* data, size_t length,
            std::string packed_rkey);

  std::shared_ptr<ucx_internal::Core> core_;
  ucp_mem_h memh_;
  char* data_;
  size_t length_;
  std::string packed_rkey_;
};

// A connection to one remote worker, used by one thread at a time.
class UcxPeer {
 public:
  ~UcxPeer();  // Closes the endpoint (forcibly if it failed), then destroys cached rkeys.

  UcxPeer(const UcxPeer&) = delete;
  UcxPeer& operator=(const UcxPeer&) = delete;

  // `local` may be any memory; registering it is optional.
  struct Transfer {
    uint64_t remote_address;
    char* local;
    size_t length;
  };

  // One-sided reads/writes of the remote region described by `packed_rkey` (unpacked once per
  // distinct rkey and cached), split into max_chunk_bytes pieces with up to `window`
  // outstanding. Return when all completed, or with the first error: UNAVAILABLE naming the
  // UCX status (e.g. the peer died; the endpoint is closed then and later calls fail too),
  // DEADLINE_EXCEEDED if not complete by `deadline`, INVALID_ARGUMENT for a malformed rkey or
  // a transfer outside the region. On an error, operations already in flight (at most
  // `window` chunks) are waited for, not cancelled: UCX cannot cancel them safely. A peer that
  // does not finish them within 5 s more gets its endpoint closed.
  absl::Status Get(absl::string_view packed_rkey, const std::vector<Transfer>& transfers,
                   absl::Time deadline);
  // Transfers of one remote region.
  struct RegionTransfers {
    absl::string_view packed_rkey;
    absl::Span<const Transfer> transfers;
  };
  // Get over several regions (e.g. every shard of a version) in one window: the reads of all
  // are in flight together instead of draining region by region. Otherwise as Get.
  absl::Status Get(const std::vector<RegionTransfers>& regions, absl::Time deadline);
  // Ends with a flush, so the data is visible at the remote side on return.
  absl::Status Put(absl::string_view packed_rkey, const std::vector<Transfer>& transfers,
                   absl::Time deadline);
  // Put over several regions (e.g. every shard of an upload) in one window and one flush.
  absl::Status Put(const std::vector<RegionTransfers>& regions, absl::Time deadline);

  // The remote bytes [remote_address, remote_address + length) of the region `packed_rkey`
  // describes, readable and writable in place: shared-memory transports map memory the owner
  // allocated through UCX into this process (ucp_rkey_ptr), so reads are plain loads and
  // writes plain stores (the owner sees them once they are globally visible: no flush), with
  // no request per block. UNIMPLEMENTED where the transport cannot (tcp, RDMA, registered rather
  // than allocated memory): use Get. INVALID_ARGUMENT as Get for a malformed rkey or a range
  // outside the region the rkey claims (as for Get, the owner is trusted to claim its real size);
  // UNAVAILABLE after an endpoint failure; INTERNAL if UCX fails otherwise. The mapping lasts
  // until this peer has unpacked kMaxCachedRkeys other rkeys since (or the peer goes), so a
  // caller maps at most that many regions at once; the bytes are the owner's live memory, so
  // they are what Get would read only while the owner keeps the region (a lease).
  absl::StatusOr<char*> Mapped(absl::string_view packed_rkey, uint64_t remote_address,
                               size_t length);

  // Unpacked rkeys kept, the least recently used dropped first (never one the call in
  // progress uses): a peer kept for long (UcxPeerCache) meets every region its owner ever
  // allocated, and where an unpacked rkey maps its region (shared memory) it would keep memory
  // the owner freed alive.
  static constexpr size_t kMaxCachedRkeys = 64;
  size_t cached_rkeys() const { return rkeys_.size(); }

  // Transports and lanes the endpoint uses (ucp_ep_print_info), for diagnostics.
  std::string DebugString() const;

 private:
  friend class UcxWorker;
  struct RemoteKey {
    ucp_rkey_h rkey;
    uint64_t base;
    uint64_t length;
    uint64_t last_used = 0;  // Of uses_.
  };

  UcxPeer(std::shared_ptr<ucx_internal::Core> core, uint64_t remote_fingerprint);
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static absl::Status CheckRange(const RemoteKey& key, uint64_t remote_address, uint64_t length);
  static absl::Status CheckBounds(const RemoteKey& key, absl::Span<const Transfer> transfers);
  absl::Status Transfers(bool put, const std::vector<RegionTransfers>& regions,
                         absl::Time deadline);
  absl::Status Issue(bool put, const RemoteKey& key, absl::Span<const Transfer> transfers,
                     absl::Time deadline, ucx_internal::RequestWindow& requests);
  absl::Status AwaitWireup(absl::Time deadline);
  absl::Status CheckUsable() const;
  absl::StatusOr<RemoteKey> Unpack(absl::string_view packed_rkey);
  // Marks the start of a public call: trims the rkeys kept to kMaxCachedRkeys (a call over more
  // regions than that keeps them all while it runs).
  void BeginCall();
  // Makes room for one more rkey if kMaxCachedRkeys are kept, sparing those of this call.
  void EvictLeastRecentlyUsedRkey();
  void Close(bool force);

  std::shared_ptr<ucx_internal::Core> core_;
  size_t max_chunk_bytes_;
  size_t max_get_chunk_bytes_;
  size_t window_;
  uint64_t remote_fingerprint_;  // Checksum of the remote address; its rkeys name it as owner.
  ucp_ep_h ep_ = nullptr;
  // First endpoint error, set by OnError from whichever thread progresses the worker.
  std::atomic<ucs_status_t> failure_{UCS_OK};
  std::map<std::string, RemoteKey, std::less<>> rkeys_;
  uint64_t uses_ = 0;        // Counts Unpack calls.
  uint64_t call_start_ = 0;  // uses_ when the public call in progress began.
};

}  // namespace tandem::transfer

#endif  // TANDEM_TRANSFER_UCX_TRANSPORT_H_
