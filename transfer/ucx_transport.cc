#include "transfer/ucx_transport.h"

#include <poll.h>
#include <ucs/type/status.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace tandem::transfer {
namespace {

// Bounds how long closing an endpoint may wait for the peer; the worker's destruction
// releases whatever is left.
constexpr absl::Duration kCloseTimeout = absl::Seconds(1);
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
// How long a failed or late transfer waits for its operations in flight (at most window
// chunks) before it closes the endpoint under them.
constexpr absl::Duration kInFlightGrace = absl::Seconds(5);
// An idle progress thread still wakes this often, so that UCX timers (keepalive, wireup
// retries) run although no event arrives.
constexpr int kIdlePollMillis = 50;
// How long destroying a worker waits for its wireup exchanges in flight to finish (see
// Core::Quiesce); a peer that does not answer within it cannot hold a shutdown longer.
constexpr absl::Duration kQuiesceTimeout = absl::Seconds(2);

absl::Status UcxStatus(absl::StatusCode code, absl::string_view what, ucs_status_t status) {
  return absl::Status(code, absl::StrCat(what, ": ", ucs_status_string(status)));
}

// FNV-1a.
uint64_t Fingerprint(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (char c : bytes) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return hash;
}

// UCX trusts the worker addresses and rkeys it is given: malformed ones make it abort (an
// assertion in ucp_address_unpack) or read out of bounds. So both travel framed by a header
// saying what they are, with a checksum of UCX's bytes that follow it, and are checked before
// UCX sees them.
struct AddressHeader {
  uint64_t magic;
  uint64_t checksum;  // Also identifies the worker, as the owner of its regions' rkeys.
};
constexpr uint64_t kAddressMagic = 0x3172646441786355;  // "UcxAddr1"

struct RkeyHeader {
  uint64_t magic;
  uint64_t checksum;
  uint64_t owner;  // The checksum of the owning worker's address.
  uint64_t base;   // Bounds of the region.
  uint64_t length;
};
constexpr uint64_t kRkeyMagic = 0x3179656b52786355;  // "UcxRkey1"

template <typename Header>
std::string Frame(Header header, absl::string_view payload) {
  header.checksum = Fingerprint(payload);
  std::string framed(sizeof(header) + payload.size(), '\0');
  std::memcpy(framed.data(), &header, sizeof(header));
  std::memcpy(framed.data() + sizeof(header), payload.data(), payload.size());
  return framed;
}

template <typename Header>
absl::StatusOr<Header> Unframe(absl::string_view framed, uint64_t magic, absl::string_view what) {
  Header header;
  if (framed.size() <= sizeof(header)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " too short"));
  }
  std::memcpy(&header, framed.data(), sizeof(header));
  if (header.magic != magic || header.checksum != Fingerprint(framed.substr(sizeof(header)))) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what));
  }
  return header;
}

absl::Status InitContext(const std::string& transports, ucp_context_h* context) {
  ucp_config_t* config;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return UcxStatus(absl::StatusCode::kInternal, "ucp_config_read", status);
  const char* env_tls = std::getenv("UCX_TLS");
  if (!transports.empty() && (env_tls == nullptr || *env_tls == '\0')) {
    status = ucp_config_modify(config, "TLS", transports.c_str());
  }
  if (status == UCS_OK) {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    status = ucp_init(&params, config, context);
  }
  ucp_config_release(config);
  if (status != UCS_OK) {
    return UcxStatus(absl::StatusCode::kInvalidArgument,
                     absl::StrCat("ucp_init with transports '", transports, "'"), status);
  }
  return absl::OkStatus();
}

absl::Status InitWorker(ucp_context_h context, ucp_worker_h* worker) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_MULTI;
  ucs_status_t status = ucp_worker_create(context, &params, worker);
  if (status != UCS_OK) return UcxStatus(absl::StatusCode::kInternal, "ucp_worker_create", status);
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  status = ucp_worker_query(*worker, &attr);
  if (status != UCS_OK) return UcxStatus(absl::StatusCode::kInternal, "ucp_worker_query", status);
  if (attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    return absl::FailedPreconditionError("UCX lacks multi-threaded workers (--enable-mt)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WorkerAddress(ucp_worker_h worker) {
  ucp_address_t* address;
  size_t length;
  ucs_status_t status = ucp_worker_get_address(worker, &address, &length);
  if (status != UCS_OK) {
    return UcxStatus(absl::StatusCode::kInternal, "ucp_worker_get_address", status);
  }
  std::string framed = Frame(AddressHeader{kAddressMagic, 0},
                             absl::string_view(reinterpret_cast<const char*>(address), length));
  ucp_worker_release_address(worker, address);
  return framed;
}

}  // namespace

namespace ucx_internal {

// The UCP context and worker, and the thread that progresses the worker. Shared by a UcxWorker
// and its regions and peers, so that the worker is destroyed only after every endpoint is
// closed and all memory is unmapped, and progressed as long as any of them may need it.
class Core {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> Create(const UcxOptions& options) {
    auto core = std::make_shared<Core>(options);
    absl::Status status = InitContext(options.transports, &core->context);
    if (status.ok()) status = InitWorker(core->context, &core->worker);
    if (!status.ok()) return status;
    int event_fd;
    ucs_status_t ucs_status = ucp_worker_get_efd(core->worker, &event_fd);
    if (ucs_status != UCS_OK) {
      return UcxStatus(absl::StatusCode::kInternal, "ucp_worker_get_efd", ucs_status);
    }
    core->event_fd_ = event_fd;
    core->progress_thread_ = std::thread([raw = core.get()] { raw->Progress(); });
    return core;
  }

  explicit Core(const UcxOptions& options) : options(options) {}
  ~Core() {
    if (progress_thread_.joinable()) {
      stop_.store(true, std::memory_order_release);
      ucp_worker_signal(worker);
      progress_thread_.join();
    }
    if (worker != nullptr) {
      Quiesce();
      ucp_worker_destroy(worker);
    }
    if (context != nullptr) ucp_cleanup(context);
  }

  const UcxOptions options;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;

 private:
  // Completes this side's requests and serves the remote operations that the transport
  // emulates in software (tcp RMA runs on the target's worker). Keeps progressing while there
  // is work and sleeps in poll() on the worker's event fd otherwise, so an idle store costs no
  // CPU. Spinning a while before sleeping was slower on 2 cores: it takes the CPU from the
  // other process's progress thread.
  void Progress() {
    while (!stop_.load(std::memory_order_acquire)) ProgressOrSleep(kIdlePollMillis);
  }

  // Progresses the worker once or, when there was nothing to do, sleeps until an event
  // arrives or `sleep_millis` pass.
  void ProgressOrSleep(int sleep_millis) {
    if (ucp_worker_progress(worker) != 0) return;
    // UCS_ERR_BUSY: events arrived since the last progress. Any other failure to arm still
    // sleeps, bounded by the timeout, instead of spinning.
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;
    pollfd event{.fd = event_fd_, .events = POLLIN, .revents = 0};
    poll(&event, 1, sleep_millis);
  }

  // Finishes the wireup exchanges in flight before the worker is destroyed. A peer's first
  // rkey unpack (or transfer) over tcp sends a wireup request; this worker's reply then waits
  // in the pending queue of the tcp endpoint UCX created for the peer until the connection
  // back to the peer is acknowledged. ucp_worker_destroy purges such queues, and UCX 1.13
  // asserts there (ucp_request_send_state_ff, ucp_request.c:684; gone in 1.14) that a purged
  // wireup message is no REPLY: a store stopped in that window aborted. So the worker is
  // flushed and progressed by this thread (the progress thread has stopped) until a flush
  // completes at once. That happens only when no tcp connection is being set up and no bytes
  // are unsent (uct_tcp_iface_flush), hence nothing is queued; and as the worker is destroyed
  // without being progressed again, no new request can queue another reply. Bounded by
  // kQuiesceTimeout: a peer that never answers cannot hold the shutdown.
  void Quiesce() {
    const absl::Time deadline = absl::Now() + kQuiesceTimeout;
    ucp_request_param_t param{};  // No callback: the request is polled.
    while (true) {
      ucs_status_ptr_t flush = ucp_worker_flush_nbx(worker, &param);
      if (!UCS_PTR_IS_PTR(flush)) return;  // Done at once (or failed): nothing to wait for.
      while (ucp_request_check_status(flush) == UCS_INPROGRESS && absl::Now() < deadline) {
        const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
        ProgressOrSleep(static_cast<int>(std::clamp<int64_t>(left, 1, kIdlePollMillis)));
      }
      ucp_request_free(flush);
      if (absl::Now() >= deadline) return;
    }
  }

  int event_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread progress_thread_;
};

// The outstanding requests of one operation. The worker's progress thread completes them; the
// calling thread sleeps until a completion callback wakes it. Progressing from the calling
// thread as well was slower: the two threads contend for the worker lock, and a spinning
// caller takes the CPU that the progress threads of both processes need. Measured on 2 cores,
// tcp, 64 MiB, median of 5 runs: caller progressing Get 870 / Put 720 MB/s; caller sleeping
// 1240 / 860 MB/s; caller spinning on the request status 1540 / 800 MB/s at more CPU. Woken
// only once enough requests completed (half a window; all of them at the end) instead of at
// each completion, a sleeping caller reaches 1330-1510 / 990-1210 MB/s (3 runs of
// ucx_transport_bench), and a weight-store fetch of 59 MiB 1030-1060 instead of 870-900 MiB/s.
class RequestWindow {
 public:
  explicit RequestWindow(absl::string_view operation, uint32_t flags = 0) : operation_(operation) {
    param_.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param_.cb.send = &RequestWindow::OnComplete;
    param_.user_data = this;
    param_.flags = flags;
  }
  // Releases requests not freed yet. ucp_request_free takes the worker lock, under which
  // callbacks run, and no callback follows it: none can touch this object once it is gone.
  ~RequestWindow() {
    for (void* request : requests_) ucp_request_free(request);
  }

  // For the *_nbx calls whose requests this window tracks.
  const ucp_request_param_t* param() const { return &param_; }

  // Tracks the result of a *_nbx call. Fails if the call did, or if a tracked request has
  // failed meanwhile, so that nothing more is issued after a failure.
  absl::Status Add(ucs_status_ptr_t request) {
    if (UCS_PTR_IS_ERR(request)) return Failed(UCS_PTR_STATUS(request));
    if (request != nullptr) {  // Null: completed in the call.
      requests_.push_back(request);
      absl::MutexLock lock(&mutex_);
      ++added_;
    }
    return FirstFailure();
  }

  // Requests whose completion callback has not run yet.
  int64_t outstanding() {
    absl::MutexLock lock(&mutex_);
    return added_ - completions_;
  }

  // Waits until at most `limit` requests are outstanding. Fails as soon as one failed.
  absl::Status WaitForAtMost(int64_t limit, absl::Time deadline) {
    const bool reached = Await(limit, /*or_failure=*/true, deadline);
    FreeCompleted();
    if (absl::Status failure = FirstFailure(); !failure.ok()) return failure;
    if (reached) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat(operation_, ": ", outstanding(), " requests outstanding at deadline"));
  }

  // Waits until no request is outstanding, whatever their status; false at `deadline`.
  bool Drain(absl::Time deadline) {
    const bool drained = Await(0, /*or_failure=*/false, deadline);
    FreeCompleted();
    return drained;
  }

 private:
  static void OnComplete(void* /*request*/, ucs_status_t status, void* user_data) {
    auto* self = static_cast<RequestWindow*>(user_data);
    absl::MutexLock lock(&self->mutex_);
    ++self->completions_;
    if (status != UCS_OK && self->failure_ == UCS_OK) self->failure_ = status;
  }

  // Sleeps until at most `limit` requests are outstanding (or, with `or_failure`, one failed).
  // The completing thread (the progress thread, on the data path) evaluates the condition and
  // wakes this one only then, instead of paying a futex wake at every completion.
  bool Await(int64_t limit, bool or_failure, absl::Time deadline) {
    absl::MutexLock lock(&mutex_);
    auto ready = [this, limit, or_failure]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return added_ - completions_ <= limit || (or_failure && failure_ != UCS_OK);
    };
    return mutex_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  }

  absl::Status FirstFailure() {
    absl::MutexLock lock(&mutex_);
    return failure_ == UCS_OK ? absl::OkStatus() : Failed(failure_);
  }

  absl::Status Failed(ucs_status_t status) const {
    return UcxStatus(absl::StatusCode::kUnavailable, operation_, status);
  }

  // Frees the requests UCX reports complete; the others are freed by a later call or the
  // destructor.
  void FreeCompleted() {
    for (size_t i = 0; i < requests_.size();) {
      if (ucp_request_check_status(requests_[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(requests_[i]);
      requests_[i] = requests_.back();
      requests_.pop_back();
    }
  }

  std::string operation_;
  ucp_request_param_t param_{};
  std::vector<void*> requests_;  // Tracked and not freed yet.
  absl::Mutex mutex_;
  int64_t added_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t completions_ ABSL_GUARDED_BY(mutex_) = 0;
  ucs_status_t failure_ ABSL_GUARDED_BY(mutex_) = UCS_OK;  // The first failed request's.
};

}  // namespace ucx_internal

using ucx_internal::Core;
using ucx_internal::RequestWindow;

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  if (options.max_chunk_bytes == 0 || options.max_get_chunk_bytes == 0 || options.window <= 0) {
    return absl::InvalidArgumentError(
        "max_chunk_bytes, max_get_chunk_bytes and window must be positive");
  }
  absl::StatusOr<std::shared_ptr<Core>> core = Core::Create(options);
  if (!core.ok()) return core.status();
  absl::StatusOr<std::string> address = WorkerAddress((*core)->worker);
  if (!address.ok()) return address.status();
  return absl::WrapUnique(new UcxWorker(*std::move(core), *std::move(address)));
}

UcxWorker::UcxWorker(std::shared_ptr<Core> core, std::string address)
    : core_(std::move(core)), address_(std::move(address)) {}

UcxWorker::~UcxWorker() = default;

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::Allocate(size_t length) {
  return Map(nullptr, length, /*allocate=*/true);
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::Register(void* data, size_t length) {
  if (data == nullptr) return absl::InvalidArgumentError("Register of a null pointer");
  return Map(data, length, /*allocate=*/false);
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxWorker::Map(void* data, size_t length,
                                                          bool allocate) {
  if (length == 0) return absl::InvalidArgumentError("region of 0 bytes");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = data;
  params.length = length;
  params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h memh;
  ucs_status_t status = ucp_mem_map(core_->context, &params, &memh);
  if (status != UCS_OK) {
    return UcxStatus(absl::StatusCode::kResourceExhausted, "ucp_mem_map", status);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  void* rkey_buffer = nullptr;
  size_t rkey_size = 0;
  status = ucp_mem_query(memh, &attr);
  if (status == UCS_OK) status = ucp_rkey_pack(core_->context, memh, &rkey_buffer, &rkey_size);
  if (status != UCS_OK) {
    ucp_mem_unmap(core_->context, memh);
    return UcxStatus(absl::StatusCode::kInternal, "ucp_rkey_pack", status);
  }
  char* base = static_cast<char*>(attr.address);
  AddressHeader own_address;
  std::memcpy(&own_address, address_.data(), sizeof(own_address));
  std::string packed = Frame(
      RkeyHeader{kRkeyMagic, 0, own_address.checksum, reinterpret_cast<uintptr_t>(base), length},
      absl::string_view(static_cast<const char*>(rkey_buffer), rkey_size));
  ucp_rkey_buffer_release(rkey_buffer);
  return absl::WrapUnique(new UcxRegion(core_, memh, base, length, std::move(packed)));
}

absl::StatusOr<std::unique_ptr<UcxPeer>> UcxWorker::Connect(absl::string_view remote_address) {
  absl::StatusOr<AddressHeader> header =
      Unframe<AddressHeader>(remote_address, kAddressMagic, "worker address");
  if (!header.ok()) return header.status();
  auto peer = absl::WrapUnique(new UcxPeer(core_, header->checksum));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address =
      reinterpret_cast<const ucp_address_t*>(remote_address.data() + sizeof(AddressHeader));
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxPeer::OnError;
  params.err_handler.arg = peer.get();
  ucs_status_t status = ucp_ep_create(core_->worker, &params, &peer->ep_);
  if (status == UCS_ERR_UNREACHABLE) {
    // UCX 1.13's shared-memory transports cannot report peer failures, and UCX refuses them
    // in PEER mode (logging "no peer failure handler"). Without it, a transfer to a dead peer
    // that needs the peer's CPU ends at its deadline (plus kInFlightGrace); shared-memory RMA
    // itself is a memcpy by this process and does not wait for the peer.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(core_->worker, &params, &peer->ep_);
  }
  if (status != UCS_OK) return UcxStatus(absl::StatusCode::kUnavailable, "ucp_ep_create", status);
  absl::Status connected = peer->AwaitWireup(absl::Now() + kConnectTimeout);
  if (!connected.ok()) return connected;
  return peer;
}

UcxRegion::UcxRegion(std::shared_ptr<Core> core, ucp_mem_h memh, char* data, size_t length,
                     std::string packed_rkey)
    : core_(std::move(core)),
      memh_(memh),
      data_(data),
      length_(length),
      packed_rkey_(std::move(packed_rkey)) {}

UcxRegion::~UcxRegion() { ucp_mem_unmap(core_->context, memh_); }

UcxPeer::UcxPeer(std::shared_ptr<Core> core, uint64_t remote_fingerprint)
    : core_(std::move(core)),
      max_chunk_bytes_(core_->options.max_chunk_bytes),
      max_get_chunk_bytes_(core_->options.max_get_chunk_bytes),
      window_(static_cast<size_t>(core_->options.window)),
      remote_fingerprint_(remote_fingerprint) {}

UcxPeer::~UcxPeer() {
  if (ep_ != nullptr) Close(/*force=*/failure_.load() != UCS_OK);
}

void UcxPeer::OnError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  ucs_status_t expected = UCS_OK;
  static_cast<UcxPeer*>(arg)->failure_.compare_exchange_strong(expected, status);
}

// A forced close completes locally and cancels outstanding requests; a graceful one flushes
// first, which a dead or stuck peer could stall, hence the bounded wait.
void UcxPeer::Close(bool force) {
  RequestWindow close("ucp_ep_close_nbx", force ? UCP_EP_CLOSE_FLAG_FORCE : 0);
  if (close.Add(ucp_ep_close_nbx(ep_, close.param())).ok()) {
    close.Drain(absl::Now() + kCloseTimeout);
  }
  ep_ = nullptr;
  for (auto& [packed, key] : rkeys_) ucp_rkey_destroy(key.rkey);
  rkeys_.clear();
}

// A flush completes once the endpoint's lanes are connected, so a peer that is gone or
// unreachable fails Connect rather than the first transfer.
absl::Status UcxPeer::AwaitWireup(absl::Time deadline) {
  RequestWindow flush("connecting (ucp_ep_flush_nbx)");
  absl::Status status = flush.Add(ucp_ep_flush_nbx(ep_, flush.param()));
  if (status.ok()) status = flush.WaitForAtMost(0, deadline);
  return status;
}

absl::Status UcxPeer::Get(absl::string_view packed_rkey, const std::vector<Transfer>& transfers,
                          absl::Time deadline) {
  return Transfers(/*put=*/false, {{packed_rkey, transfers}}, deadline);
}

absl::Status UcxPeer::Get(const std::vector<RegionTransfers>& regions, absl::Time deadline) {
  return Transfers(/*put=*/false, regions, deadline);
}

absl::Status UcxPeer::Put(absl::string_view packed_rkey, const std::vector<Transfer>& transfers,
                          absl::Time deadline) {
  return Transfers(/*put=*/true, {{packed_rkey, transfers}}, deadline);
}

absl::Status UcxPeer::Put(const std::vector<RegionTransfers>& regions, absl::Time deadline) {
  return Transfers(/*put=*/true, regions, deadline);
}

absl::StatusOr<char*> UcxPeer::Mapped(absl::string_view packed_rkey, uint64_t remote_address,
                                      size_t length) {
  BeginCall();
  if (absl::Status usable = CheckUsable(); !usable.ok()) return usable;
  absl::StatusOr<RemoteKey> key = Unpack(packed_rkey);
  if (!key.ok()) return key.status();
  if (absl::Status inside = CheckRange(*key, remote_address, length); !inside.ok()) return inside;
  void* local = nullptr;
  const ucs_status_t status = ucp_rkey_ptr(key->rkey, remote_address, &local);
  if (status == UCS_ERR_UNREACHABLE) {
    return absl::UnimplementedError("the remote region is not mapped by this peer's transports");
  }
  if (status != UCS_OK) return UcxStatus(absl::StatusCode::kInternal, "ucp_rkey_ptr", status);
  return static_cast<char*>(local);
}

absl::Status UcxPeer::CheckUsable() const {
  ucs_status_t failure = failure_.load();
  if (failure != UCS_OK) return UcxStatus(absl::StatusCode::kUnavailable, "endpoint", failure);
  if (ep_ == nullptr) return absl::UnavailableError("endpoint closed after an earlier failure");
  return absl::OkStatus();
}

absl::StatusOr<UcxPeer::RemoteKey> UcxPeer::Unpack(absl::string_view packed_rkey) {
  const uint64_t now = ++uses_;
  auto cached = rkeys_.find(packed_rkey);
  if (cached != rkeys_.end()) {
    cached->second.last_used = now;
    return cached->second;
  }
  absl::StatusOr<RkeyHeader> header = Unframe<RkeyHeader>(packed_rkey, kRkeyMagic, "rkey");
  if (!header.ok()) return header.status();
  if (header->owner != remote_fingerprint_) {
    return absl::InvalidArgumentError("rkey of another worker than this peer's");
  }
  RemoteKey key{nullptr, header->base, header->length, now};
  ucs_status_t status = ucp_ep_rkey_unpack(ep_, packed_rkey.data() + sizeof(RkeyHeader), &key.rkey);
  if (status != UCS_OK) {
    return UcxStatus(absl::StatusCode::kInvalidArgument, "ucp_ep_rkey_unpack", status);
  }
  EvictLeastRecentlyUsedRkey();
  rkeys_.emplace(std::string(packed_rkey), key);
  return key;
}

void UcxPeer::BeginCall() {
  call_start_ = uses_ + 1;
  while (rkeys_.size() > kMaxCachedRkeys) EvictLeastRecentlyUsedRkey();
}

void UcxPeer::EvictLeastRecentlyUsedRkey() {
  if (rkeys_.size() < kMaxCachedRkeys) return;
  auto oldest = rkeys_.end();
  for (auto it = rkeys_.begin(); it != rkeys_.end(); ++it) {
    const bool spared = it->second.last_used >= call_start_;  // The call in progress uses it.
    if (!spared && (oldest == rkeys_.end() || it->second.last_used < oldest->second.last_used)) {
      oldest = it;
    }
  }
  if (oldest == rkeys_.end()) return;
  ucp_rkey_destroy(oldest->second.rkey);
  rkeys_.erase(oldest);
}

absl::Status UcxPeer::CheckRange(const RemoteKey& key, uint64_t remote_address, uint64_t length) {
  const uint64_t offset = remote_address - key.base;
  if (remote_address < key.base || offset > key.length || length > key.length - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(length, " bytes at ", remote_address, " are outside the remote region"));
  }
  return absl::OkStatus();
}

absl::Status UcxPeer::CheckBounds(const RemoteKey& key, absl::Span<const Transfer> transfers) {
  for (const Transfer& transfer : transfers) {
    if (absl::Status inside = CheckRange(key, transfer.remote_address, transfer.length);
        !inside.ok()) {
      return inside;
    }
    if (transfer.local == nullptr && transfer.length > 0) {
      return absl::InvalidArgumentError("transfer to or from a null local buffer");
    }
  }
  return absl::OkStatus();
}

absl::Status UcxPeer::Issue(bool put, const RemoteKey& key, absl::Span<const Transfer> transfers,
                            absl::Time deadline, RequestWindow& requests) {
  const ucp_request_param_t* param = requests.param();
  const size_t chunk_bytes = put ? max_chunk_bytes_ : max_get_chunk_bytes_;
  for (const Transfer& transfer : transfers) {
    for (size_t offset = 0; offset < transfer.length; offset += chunk_bytes) {
      // A full window is refilled once half of it completed: a wake-up per completion costs
      // more than the shallower window.
      const int64_t window = static_cast<int64_t>(window_);
      if (requests.outstanding() >= window) {
        if (absl::Status status = requests.WaitForAtMost(window / 2, deadline); !status.ok()) {
          return status;
        }
      }
      size_t length = std::min(chunk_bytes, transfer.length - offset);
      char* local = transfer.local + offset;
      uint64_t remote = transfer.remote_address + offset;
      absl::Status status =
          requests.Add(put ? ucp_put_nbx(ep_, local, length, remote, key.rkey, param)
                           : ucp_get_nbx(ep_, local, length, remote, key.rkey, param));
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

absl::Status UcxPeer::Transfers(bool put, const std::vector<RegionTransfers>& regions,
                                absl::Time deadline) {
  BeginCall();
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  // Every region is checked before anything is issued: a bad one transfers nothing.
  std::vector<RemoteKey> keys;
  for (const RegionTransfers& region : regions) {
    absl::StatusOr<RemoteKey> key = Unpack(region.packed_rkey);
    if (!key.ok()) return key.status();
    status = CheckBounds(*key, region.transfers);
    if (!status.ok()) return status;
    keys.push_back(*key);
  }
  RequestWindow requests(put ? "ucp_put_nbx" : "ucp_get_nbx");
  for (size_t i = 0; i < regions.size() && status.ok(); ++i) {
    status = Issue(put, keys[i], regions[i].transfers, deadline, requests);
  }
  if (status.ok() && put) status = requests.Add(ucp_ep_flush_nbx(ep_, requests.param()));
  if (status.ok()) status = requests.WaitForAtMost(0, deadline);
  if (status.ok()) return status;
  // Requests in flight write the caller's buffers until they complete: wait for them rather
  // than cancel them. A forced close cancels them, but over tcp the peer's replies to earlier
  // gets still arrive and, carrying raw request pointers, land in recycled requests and freed
  // buffers. Only a peer stuck past the grace period is closed anyway, to bound the wait.
  const absl::Time grace_end = std::max(deadline, absl::Now()) + kInFlightGrace;
  if (!requests.Drain(grace_end) || failure_.load() != UCS_OK) Close(/*force=*/true);
  return status;
}

std::string UcxPeer::DebugString() const {
  if (ep_ == nullptr) return "closed endpoint";
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return "open_memstream failed";
  ucp_ep_print_info(ep_, stream);
  std::fclose(stream);
  std::string info(buffer, size);
  std::free(buffer);
  return info;
}

}  // namespace tandem::transfer
