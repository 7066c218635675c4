#include "common/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace tandem {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration duration) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(duration));
}

absl::Status CheckCount(const char* name, int64_t count) {
  if (count >= 0) return absl::OkStatus();
  return InvalidRequest("COMMUNICATOR_MISUSE", absl::StrCat(name, ": count ", count, " < 0"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidRequest("COMMUNICATOR_MISUSE", absl::StrCat("Gloo group: rank ", rank, " of ",
                                                              size, " is outside [0, size)"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return InvalidRequest("COMMUNICATOR_MISUSE", "Gloo group: the timeout must be > 0");
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToChrono(options.join_timeout.value_or(options.timeout)));
    context->connectFullMesh(store, device);
    context->setTimeout(ToChrono(options.timeout));
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(context), rank, size));
  } catch (const std::exception& error) {
    return MarkBrokenGroup(absl::UnavailableError(
        absl::StrCat("Gloo group: rank ", rank, " of ", size, " cannot join on ", options.hostname,
                     ": ", error.what())));
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size)
    : context_(std::move(context)), rank_(rank), size_(size) {}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Operation>
absl::Status GlooCommunicator::Collective(const char* name, Operation&& operation) {
  if (!broken_.ok()) {
    return MarkBrokenGroup(absl::FailedPreconditionError(
        absl::StrCat(name, ": the group broke earlier (", broken_.message(), ")")));
  }
  try {
    operation(next_tag_++);
    return absl::OkStatus();
  } catch (const std::exception& error) {
    // Gloo reports a dead peer, a closed connection and a timeout alike, as IoException.
    broken_ = MarkBrokenGroup(absl::UnavailableError(
        absl::StrCat(name, " on rank ", rank_, " of ", size_, ": ", error.what())));
    return broken_;
  }
}

absl::Status GlooCommunicator::AllReduce(const char* name, float* data, int64_t count,
                                         std::optional<absl::Duration> timeout) {
  if (absl::Status status = CheckCount(name, count); !status.ok()) return status;
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return Collective(name, [&](uint32_t tag) {
    gloo::AllreduceOptions options(context_);
    options.setOutput(data, static_cast<size_t>(count));
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options.setTag(tag);
    if (timeout) options.setTimeout(ToChrono(*timeout));
    gloo::allreduce(options);
  });
}

absl::Status GlooCommunicator::AllReduceSum(float* data, int64_t count) {
  return AllReduce("AllReduceSum", data, count, std::nullopt);
}

absl::Status GlooCommunicator::AllReduceSumAwaiting(float* data, int64_t count,
                                                    absl::Duration wait) {
  if (wait <= absl::ZeroDuration()) {
    return InvalidRequest("COMMUNICATOR_MISUSE", "AllReduceSumAwaiting: the wait must be > 0");
  }
  return AllReduce("AllReduceSumAwaiting", data, count, wait);
}

absl::Status GlooCommunicator::Broadcast(float* data, int64_t count, int root) {
  if (absl::Status status = CheckCount("Broadcast", count); !status.ok()) return status;
  if (root < 0 || root >= size_) {
    return InvalidRequest("COMMUNICATOR_MISUSE",
                          absl::StrCat("Broadcast: root ", root, " is outside [0, ", size_, ")"));
  }
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return Collective("Broadcast", [&](uint32_t tag) {
    gloo::BroadcastOptions options(context_);
    options.setOutput(data, static_cast<size_t>(count));
    options.setRoot(root);
    options.setTag(tag);
    gloo::broadcast(options);
  });
}

absl::Status GlooCommunicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  return Collective("Barrier", [&](uint32_t tag) {
    gloo::BarrierOptions options(context_);
    options.setTag(tag);
    gloo::barrier(options);
  });
}

absl::Status GlooCommunicator::AllToAllV(const float* send, absl::Span<const int64_t> send_counts,
                                         float* receive, absl::Span<const int64_t> receive_counts) {
  if (absl::Status status = ValidateAllToAllVCounts(send_counts, receive_counts, size_);
      !status.ok()) {
    return status;
  }
  if (size_ == 1) {
    if (send_counts[0] != receive_counts[0]) {
      return InvalidRequest("COMMUNICATOR_MISUSE",
                            absl::StrCat("AllToAllV: rank 0 sends itself ", send_counts[0],
                                         " values but expects ", receive_counts[0]));
    }
    std::copy(send, send + send_counts[0], receive);
    return absl::OkStatus();
  }
  return Collective("AllToAllV", [&](uint32_t tag) {
    gloo::AlltoallvOptions options(context_);
    // Gloo takes non-const input pointers but only reads them.
    options.setInput(const_cast<float*>(send),
                     std::vector<int64_t>(send_counts.begin(), send_counts.end()));
    options.setOutput(receive, std::vector<int64_t>(receive_counts.begin(), receive_counts.end()));
    options.setTag(tag);
    gloo::alltoallv(options);
  });
}

}  // namespace tandem
