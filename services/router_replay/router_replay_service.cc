#include "services/router_replay/router_replay_service.h"

#include <malloc.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/finished_reactor.h"
#include "common/status.h"
#include "common/unary.h"
#include "prometheus/histogram.h"
#include "services/router_replay/balance_query.h"
#include "services/router_replay/route_queries.h"
#include "services/router_replay/router_replay_metrics.h"

namespace tandem::router_replay {
namespace {

constexpr absl::Duration kMinTrimInterval = absl::Seconds(5);

constexpr size_t kMaxChunkRowBytes = size_t{4} << 20;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// Checks the chunk's sizes before anything touches its rows.
absl::Status CheckChunkSizes(const routerreplay::v1::AppendRequest& request, const RecordKey& key,
                             const RouteShape& shape) {
  // The sizes need a valid shape; the key and rows are checked by the store.
  if (absl::Status status = ValidateShape(shape); !status.ok()) {
    return Annotate(status, absl::StrCat("record ", ToString(key), ": "));
  }
  if (request.num_tokens() < 1 || request.token_offset() < 0) {
    return InvalidField(
        request.num_tokens() < 1 ? "num_tokens" : "token_offset",
        absl::StrCat("record ", ToString(key), ": num_tokens ", request.num_tokens(),
                     " must be >= 1 and token_offset ", request.token_offset(), " >= 0"));
  }
  if (request.rows().size() > kMaxChunkRowBytes) {
    return InvalidField("rows",
                        absl::StrCat("record ", ToString(key), ": chunk of ", request.rows().size(),
                                     " row bytes exceeds the 4 MiB limit"));
  }
  const int64_t expected = int64_t{request.num_tokens()} * shape.ids_per_row() * 2;
  if (static_cast<int64_t>(request.rows().size()) != expected) {
    return InvalidField(
        "rows",
        absl::StrCat("record ", ToString(key), ": rows has ", request.rows().size(),
                     " bytes; expected num_tokens × layers × top_k × 2 = ", request.num_tokens(),
                     " × ", shape.layers.size(), " × ", shape.top_k, " × 2 = ", expected));
  }
  return absl::OkStatus();
}

// Reads an Append stream chunk by chunk, storing each as it arrives, and replies once the
// stream ends and everything stored is durable.
class AppendReactor final : public grpc::ServerReadReactor<routerreplay::v1::AppendRequest> {
 public:
  AppendReactor(RouteStore& store, routerreplay::v1::AppendResponse* response)
      : store_(store), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishStream();
      return;
    }
    const absl::Time start = absl::Now();
    absl::Status status = StoreChunk();
    RouterReplayMetrics::Get().append_chunk_seconds.Observe(SecondsSince(start));
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status StoreChunk() {
    RouteChunk chunk{.key = FromProto(request_.key()),
                     .shape = {.layers = {request_.moe_layer_indices().begin(),
                                          request_.moe_layer_indices().end()},
                               .top_k = request_.top_k(),
                               .num_experts = request_.num_experts()},
                     .first_row = request_.token_offset(),
                     .num_rows = request_.num_tokens(),
                     .seal = request_.seal()};
    if (absl::Status status = CheckChunkSizes(request_, chunk.key, chunk.shape); !status.ok()) {
      return status;
    }
    // The wire bytes are little-endian int16 like this machine; copy for alignment.
    rows_.resize(request_.rows().size() / sizeof(int16_t));
    std::memcpy(rows_.data(), request_.rows().data(), request_.rows().size());
    chunk.rows = rows_.data();
    absl::StatusOr<AppendOutcome> outcome = store_.Append(chunk);
    if (!outcome.ok()) return outcome.status();
    RouterReplayMetrics::Get().RecordAppend(chunk.shape, *outcome);
    routerreplay::v1::RecordAck& ack = AckFor(chunk.key);
    ack.set_acknowledged_rows(outcome->rows);
    ack.set_sealed(outcome->sealed);
    return absl::OkStatus();
  }

  routerreplay::v1::RecordAck& AckFor(const RecordKey& key) {
    const std::string encoded = EncodeRecordKey(key);
    auto [it, inserted] = ack_index_.try_emplace(encoded, response_->records_size());
    if (inserted) *response_->add_records()->mutable_key() = request_.key();
    return *response_->mutable_records(it->second);
  }

  void FinishStream() {
    const absl::Time start = absl::Now();
    absl::Status synced = store_.Sync();
    RouterReplayMetrics::Get().sync_seconds.Observe(SecondsSince(start));
    RouterReplayMetrics::Get().RecordTotals(store_.totals());
    Finish(ToGrpcStatus(synced));
  }

  RouteStore& store_;
  routerreplay::v1::AppendResponse* response_;
  routerreplay::v1::AppendRequest request_;
  std::vector<int16_t> rows_;
  absl::flat_hash_map<std::string, int> ack_index_;
};

// Streams a planned fetch one message at a time.
class FetchReactor final : public grpc::ServerWriteReactor<routerreplay::v1::FetchRoutesResponse> {
 public:
  FetchReactor(const RouteStore& store, const routerreplay::v1::FetchRoutesRequest& request,
               std::unique_ptr<CallTracker::Token> slot, grpc::CallbackServerContext* context,
               WriteStallGuard& stalls)
      : slot_(std::move(slot)), context_(context), stalls_(stalls) {
    absl::StatusOr<FetchPlan> plan = PlanFetch(store, request);
    if (!plan.ok()) {
      Finish(ToGrpcStatus(plan.status()));
      return;
    }
    cursor_.emplace(store, *std::move(plan));
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    stalls_.WriteDone(context_);
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "FetchRoutes: the client went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    stalls_.Remove(context_);
    delete this;
  }

 private:
  void WriteNext() {
    absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> next = cursor_->Next();
    if (!next.ok()) {
      Finish(ToGrpcStatus(next.status()));
      return;
    }
    if (!next->has_value()) {
      Finish(grpc::Status::OK);
      return;
    }
    response_ = **std::move(next);
    RouterReplayMetrics::Get().RecordFetch(response_.num_rows(),
                                           static_cast<int64_t>(response_.rows().size()));
    stalls_.WriteStarted(context_);
    StartWrite(&response_);
  }

  const std::unique_ptr<CallTracker::Token> slot_;  // One of max_fetch_streams, until done.
  grpc::CallbackServerContext* const context_;
  WriteStallGuard& stalls_;
  std::optional<FetchCursor> cursor_;
  routerreplay::v1::FetchRoutesResponse response_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RouterReplayServiceImpl>> RouterReplayServiceImpl::Create(
    const RouterReplayOptions& options) {
  absl::StatusOr<std::unique_ptr<RouteStore>> store = RouteStore::Open(options.store);
  if (!store.ok()) return store.status();
  if (options.max_fetch_streams < 1) {
    return InvalidRequest(
        "INVALID_OPTION",
        absl::StrCat("max_fetch_streams is ", options.max_fetch_streams, "; must be >= 1"));
  }
  if (options.fetch_write_timeout <= absl::ZeroDuration()) {
    return InvalidRequest("INVALID_OPTION", "fetch_write_timeout must be positive");
  }
  std::unique_ptr<RouterReplayServiceImpl> service(
      new RouterReplayServiceImpl(*std::move(store), options));
  if (options.retention_ttl > absl::ZeroDuration()) {
    service->sweeper_ = std::make_unique<RetentionSweeper>(*service->store_, options.retention_ttl,
                                                           options.sweep_interval);
  }
  RouterReplayMetrics::Get().RecordTotals(service->store_->totals());
  return service;
}

RouterReplayServiceImpl::RouterReplayServiceImpl(std::unique_ptr<RouteStore> store,
                                                 const RouterReplayOptions& options)
    : store_(std::move(store)),
      max_fetch_streams_(options.max_fetch_streams),
      // Fetch responses are large and freed in bursts; hand their memory back to the system
      // when no fetch runs, so a burst of stalled clients does not leave the process big
      // (at most every few seconds: a trim walks the heap under the allocator's lock).
      fetch_streams_([this] { TrimMemory(); }),
      fetch_stalls_("FetchRoutes", options.fetch_write_timeout) {}

void RouterReplayServiceImpl::TrimMemory() {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&trim_mutex_);
    if (now - last_trim_ < kMinTrimInterval) return;
    last_trim_ = now;
  }
  malloc_trim(0);
}

grpc::ServerReadReactor<routerreplay::v1::AppendRequest>* RouterReplayServiceImpl::Append(
    grpc::CallbackServerContext* /*context*/, routerreplay::v1::AppendResponse* response) {
  return new AppendReactor(*store_, response);
}

grpc::ServerUnaryReactor* RouterReplayServiceImpl::Seal(
    grpc::CallbackServerContext* context, const routerreplay::v1::SealRequest* request,
    routerreplay::v1::SealResponse* response) {
  const auto seal = [&]() -> absl::StatusOr<routerreplay::v1::SealResponse> {
    absl::StatusOr<RecordInfo> sealed =
        store_->Seal(FromProto(request->key()), request->total_rows());
    if (!sealed.ok()) return sealed.status();
    if (absl::Status synced = store_->Sync(); !synced.ok()) return synced;
    RouterReplayMetrics::Get().RecordTotals(store_->totals());
    routerreplay::v1::SealResponse result;
    result.set_total_rows(sealed->rows);
    return result;
  };
  return FinishUnary(context, seal(), response);
}

grpc::ServerWriteReactor<routerreplay::v1::FetchRoutesResponse>*
RouterReplayServiceImpl::FetchRoutes(grpc::CallbackServerContext* context,
                                     const routerreplay::v1::FetchRoutesRequest* request) {
  std::unique_ptr<CallTracker::Token> slot = fetch_streams_.TryEnter(max_fetch_streams_);
  if (slot == nullptr) {
    return new FinishedReactor<grpc::ServerWriteReactor<routerreplay::v1::FetchRoutesResponse>>(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("router-replay serves ", max_fetch_streams_,
                                  " FetchRoutes streams at once (--max_fetch_streams); retry "
                                  "when one ends")));
  }
  return new FetchReactor(*store_, *request, std::move(slot), context, fetch_stalls_);
}

grpc::ServerUnaryReactor* RouterReplayServiceImpl::GetExpertLoad(
    grpc::CallbackServerContext* context, const routerreplay::v1::GetExpertLoadRequest* request,
    routerreplay::v1::GetExpertLoadResponse* response) {
  return FinishUnary(context, CountExpertLoad(*store_, *request), response);
}

grpc::ServerUnaryReactor* RouterReplayServiceImpl::PlanPlacement(
    grpc::CallbackServerContext* context, const routerreplay::v1::PlanPlacementRequest* request,
    routerreplay::v1::PlanPlacementResponse* response) {
  return FinishUnary(context, PlanExpertPlacement(*store_, *request), response);
}

grpc::ServerUnaryReactor* RouterReplayServiceImpl::PlanBalance(
    grpc::CallbackServerContext* context, const routerreplay::v1::PlanBalanceRequest* request,
    routerreplay::v1::PlanBalanceResponse* response) {
  return FinishUnary(context, PlanStepBalance(*request), response);
}

grpc::ServerUnaryReactor* RouterReplayServiceImpl::DeleteRecords(
    grpc::CallbackServerContext* context, const routerreplay::v1::DeleteRecordsRequest* request,
    routerreplay::v1::DeleteRecordsResponse* response) {
  const auto delete_records = [&]() -> absl::StatusOr<routerreplay::v1::DeleteRecordsResponse> {
    if (absl::Status status = ValidateJobId(request->job_id()); !status.ok()) return status;
    absl::StatusOr<RowSpan> versions = VersionSpan(request->versions());
    if (!versions.ok()) return versions.status();
    absl::StatusOr<DeleteOutcome> deleted =
        store_->DeleteJob(request->job_id(), versions->begin, versions->end);
    if (!deleted.ok()) return deleted.status();
    RouterReplayMetrics::Get().RecordDeleted(deleted->records, /*by_ttl=*/false);
    RouterReplayMetrics::Get().RecordTotals(store_->totals());
    routerreplay::v1::DeleteRecordsResponse result;
    result.set_records_deleted(deleted->records);
    result.set_bytes_freed(deleted->bytes);
    return result;
  };
  return FinishUnary(context, delete_records(), response);
}

}  // namespace tandem::router_replay
