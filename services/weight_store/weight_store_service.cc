#include "services/weight_store/weight_store_service.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adapter_selector.h"
#include "common/finished_reactor.h"
#include "common/identifier.h"
#include "common/open_streams.h"
#include "common/proto_time.h"
#include "common/queued_write_reactor.h"
#include "common/status.h"
#include "common/string_limits.h"
#include "common/unary.h"
#include "services/weight_store/announcement_stream.h"
#include "services/weight_store/lease_ttl.h"
#include "services/weight_store/manifest.h"
#include "services/weight_store/tensor_fetch.h"
#include "services/weight_store/weight_store_metrics.h"

namespace tandem::weight_store {
namespace {

constexpr size_t kMaxChunkBytes = size_t{4} << 20;  // Of a PutShard chunk.

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// Reads PutShard chunks into an upload; replies with what the stream wrote.
class PutShardReactor final : public grpc::ServerReadReactor<weightstore::v1::PutShardRequest> {
 public:
  PutShardReactor(AdapterStore& store, weightstore::v1::PutShardResponse* response)
      : store_(store), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok && upload_id_.empty()) {
      Finish(ToGrpcStatus(InvalidField(
          "upload_id", "PutShard stream ended without a chunk: upload_id is required")));
      return;
    }
    if (!ok) {
      for (const auto& [shard, written] : progress_) {
        weightstore::v1::ShardProgress& entry = *response_->add_shards();
        entry.set_shard_index(shard);
        entry.set_bytes_written(written);
      }
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status status = Store(); !status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Store() {
    if (upload_id_.empty()) {
      if (absl::Status status = ValidateIdentifier("upload_id", request_.upload_id());
          !status.ok()) {
        return status;
      }
      upload_id_ = request_.upload_id();
    }
    if (request_.upload_id() != upload_id_) {
      return InvalidField("upload_id", absl::StrCat("chunk names upload ", request_.upload_id(),
                                                    "; this stream writes ", upload_id_));
    }
    if (request_.data().empty() || request_.data().size() > kMaxChunkBytes) {
      return InvalidField(
          "data", absl::StrCat("data has ", request_.data().size(), " bytes; allowed 1 B..4 MiB"));
    }
    absl::StatusOr<uint64_t> written =
        store_.Put(upload_id_, request_.shard_index(), request_.offset(), request_.data());
    if (!written.ok()) return written.status();
    progress_[request_.shard_index()] = *written;
    response_->set_bytes_received(response_->bytes_received() + request_.data().size());
    response_->set_chunks_received(response_->chunks_received() + 1);
    WeightStoreMetrics::Get().RecordIn(Transport::kGrpc,
                                       static_cast<int64_t>(request_.data().size()));
    return absl::OkStatus();
  }

  AdapterStore& store_;
  weightstore::v1::PutShardResponse* response_;
  weightstore::v1::PutShardRequest request_;
  std::string upload_id_;
  std::map<int, uint64_t> progress_;
};

// Streams the newest version, then every newer commit. A slow reader skips to the newest
// version; whatever comes first is the snapshot.
class WatchReactor final : public AnnouncementStream<weightstore::v1::WatchVersionsResponse> {
 public:
  WatchReactor(AdapterStore& store, OpenStreams<weightstore::v1::WatchVersionsResponse>& open,
               const std::string& adapter, const std::function<void()>& registered_hook)
      : AnnouncementStream(store, open) {
    watch_id_ = store_.Watch(adapter, [sink = sink()](const weightstore::v1::VersionInfo& version) {
      sink->Write(Event(version, weightstore::v1::VERSION_EVENT_TYPE_COMMITTED));
    });
    if (registered_hook) registered_hook();  // Tests: commits land here, in the window.
    weightstore::v1::WatchVersionsResponse snapshot =
        Event(store_.Newest(adapter), weightstore::v1::VERSION_EVENT_TYPE_SNAPSHOT);
    snapshot.set_upload_open(store_.HasOpenUpload(adapter));
    sink()->Write(std::move(snapshot));
    open_id_ = open_.Add(sink());
  }

 private:
  static weightstore::v1::WatchVersionsResponse Event(const weightstore::v1::VersionInfo& version,
                                                      weightstore::v1::VersionEventType type) {
    weightstore::v1::WatchVersionsResponse event;
    event.set_type(type);
    *event.mutable_version() = version;
    return event;
  }

  // The first event out is the snapshot, whichever came first: a commit announced between
  // Watch and Newest in the constructor, or the constructor's; every later one is a commit.
  void Enqueue(std::deque<weightstore::v1::WatchVersionsResponse>& queue,
               weightstore::v1::WatchVersionsResponse event) override {
    const std::optional<weightstore::v1::VersionEventType> type =
        announced_.Offer(event.version().version());
    if (!type.has_value()) return;
    event.set_type(*type);
    queue.clear();
    queue.push_back(std::move(event));
  }
};

// Streams a version assembled into the consumer's layout (TensorFetch), one chunk at a time.
class FetchReactor final : public grpc::ServerWriteReactor<weightstore::v1::FetchTensorsResponse> {
 public:
  FetchReactor(AdapterStore& store, const weightstore::v1::FetchTensorsRequest& request)
      : started_(absl::Now()) {
    absl::StatusOr<TensorFetch> fetch = TensorFetch::Start(store, request);
    if (!fetch.ok()) {
      Finish(ToGrpcStatus(fetch.status()));
      return;
    }
    fetch_.emplace(*std::move(fetch));
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "FetchTensors: the client went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    while (offset_ >= tensor_.bytes.size()) {  // The current tensor is sent (or none yet).
      if (fetch_->done()) {
        WeightStoreMetrics::Get().fetch_seconds.Observe(SecondsSince(started_));
        Finish(grpc::Status::OK);
        return;
      }
      absl::StatusOr<TensorFetch::Tensor> next = fetch_->Next();
      if (!next.ok()) {
        Finish(ToGrpcStatus(next.status()));
        return;
      }
      tensor_ = *std::move(next);
      offset_ = 0;
    }
    response_.Clear();
    if (offset_ == 0) *response_.mutable_tensor() = tensor_.header;
    const size_t length = std::min(fetch_->chunk_bytes(), tensor_.bytes.size() - offset_);
    response_.set_offset(offset_);
    response_.set_data(tensor_.bytes.data() + offset_, length);
    offset_ += length;
    WeightStoreMetrics::Get().RecordOut(Transport::kGrpc, static_cast<int64_t>(length));
    StartWrite(&response_);
  }

  const absl::Time started_;
  std::optional<TensorFetch> fetch_;
  TensorFetch::Tensor tensor_;
  size_t offset_ = 0;
  weightstore::v1::FetchTensorsResponse response_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightStoreServiceImpl>> WeightStoreServiceImpl::Create(
    const WeightStoreOptions& options) {
  std::unique_ptr<WeightStoreServiceImpl> service(new WeightStoreServiceImpl());
  if (options.enable_ucx) {
    absl::StatusOr<std::unique_ptr<transfer::UcxWorker>> ucx =
        transfer::UcxWorker::Create(options.ucx);
    if (!ucx.ok()) return ucx.status();
    service->ucx_ = *std::move(ucx);
  }
  absl::StatusOr<std::unique_ptr<AdapterStore>> store =
      AdapterStore::Open({.data_dir = options.data_dir,
                          .keep_versions = options.keep_versions,
                          .upload_expiry = options.upload_expiry,
                          .ucx = service->ucx_.get()});
  if (!store.ok()) return store.status();
  service->store_ = *std::move(store);
  service->watch_registered_hook_ = options.watch_registered_hook;
  service->sweeper_ =
      std::make_unique<PeriodicThread>(options.sweep_interval, [store = service->store_.get()] {
        store->ExpireAndRetain(absl::Now());
        WeightStoreMetrics::Get().RecordTotals(store->totals());
      });
  WeightStoreMetrics::Get().RecordTotals(service->store_->totals());
  return service;
}

std::unique_ptr<WeightStoreUcxServiceImpl> WeightStoreServiceImpl::NewUcxService() const {
  return std::make_unique<WeightStoreUcxServiceImpl>(ucx_, store_);
}

absl::StatusOr<std::vector<HostedService>> WeightStoreServices(const WeightStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<WeightStoreServiceImpl>> service =
      WeightStoreServiceImpl::Create(options);
  if (!service.ok()) return service.status();
  WeightStoreServiceImpl* api = service->get();
  std::vector<HostedService> services;
  std::unique_ptr<WeightStoreUcxServiceImpl> ucx = api->NewUcxService();
  WeightStoreUcxServiceImpl* data_plane = ucx.get();
  services.push_back({"tandem.weightstore.v1.WeightStoreService", *std::move(service),
                      /*ready=*/nullptr, [api] { api->Drain(); }});
  services.push_back({"tandem.internal.v1.WeightStoreUcxService", std::move(ucx),
                      /*ready=*/nullptr, [data_plane] { data_plane->Drain(); }});
  return services;
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::BeginPublish(
    grpc::CallbackServerContext* context, const weightstore::v1::BeginPublishRequest* request,
    weightstore::v1::BeginPublishResponse* response) {
  const auto begin = [&]() -> absl::StatusOr<weightstore::v1::BeginPublishResponse> {
    absl::StatusOr<BeginResult> begun = store_->Begin(request->manifest(), /*use_ucx=*/false);
    if (!begun.ok()) return begun.status();
    weightstore::v1::BeginPublishResponse result;
    result.set_upload_id(begun->upload_id);
    *result.mutable_expire_time() = ToTimestamp(begun->expire_time);
    WeightStoreMetrics::Get().RecordTotals(store_->totals());
    return result;
  };
  return FinishUnary(context, begin(), response);
}

grpc::ServerReadReactor<weightstore::v1::PutShardRequest>* WeightStoreServiceImpl::PutShard(
    grpc::CallbackServerContext* /*context*/, weightstore::v1::PutShardResponse* response) {
  return new PutShardReactor(*store_, response);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::CommitPublish(
    grpc::CallbackServerContext* context, const weightstore::v1::CommitPublishRequest* request,
    weightstore::v1::CommitPublishResponse* response) {
  const auto commit = [&]() -> absl::StatusOr<weightstore::v1::CommitPublishResponse> {
    if (absl::Status status = ValidateIdentifier("upload_id", request->upload_id()); !status.ok()) {
      return status;
    }
    absl::StatusOr<AdapterStore::CommitOutcome> outcome = store_->Commit(request->upload_id());
    if (!outcome.ok()) return outcome.status();
    if (!outcome->repeated) {
      WeightStoreMetrics& metrics = WeightStoreMetrics::Get();
      metrics.publish_seconds.Observe(absl::ToDoubleSeconds(outcome->since_begin));
      if (outcome->by_ucx) {
        metrics.RecordIn(Transport::kUcx, static_cast<int64_t>(outcome->version.total_bytes()));
      }
      metrics.RecordTotals(store_->totals());
    }
    weightstore::v1::CommitPublishResponse result;
    *result.mutable_version() = outcome->version;
    return result;
  };
  return FinishUnary(context, commit(), response);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::AbortPublish(
    grpc::CallbackServerContext* context, const weightstore::v1::AbortPublishRequest* request,
    weightstore::v1::AbortPublishResponse* response) {
  absl::Status aborted = ValidateIdentifier("upload_id", request->upload_id());
  if (aborted.ok()) aborted = store_->Abort(request->upload_id());
  absl::StatusOr<weightstore::v1::AbortPublishResponse> result =
      aborted.ok() ? absl::StatusOr<weightstore::v1::AbortPublishResponse>(
                         weightstore::v1::AbortPublishResponse())
                   : absl::StatusOr<weightstore::v1::AbortPublishResponse>(aborted);
  return FinishUnary(context, std::move(result), response);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::GetManifest(
    grpc::CallbackServerContext* context, const weightstore::v1::GetManifestRequest* request,
    weightstore::v1::GetManifestResponse* response) {
  const auto get = [&]() -> absl::StatusOr<weightstore::v1::GetManifestResponse> {
    const type::v1::AdapterSelector& selector = request->adapter();
    // Its errors name their field at its path here ("adapter.min_version").
    if (absl::Status status = ValidateNamedSelector(selector); !status.ok()) return status;
    absl::StatusOr<std::shared_ptr<const CommittedVersion>> version =
        store_->Find(selector.adapter_name(), selector.exact_version(), selector.min_version());
    if (!version.ok()) return version.status();
    weightstore::v1::GetManifestResponse result;
    *result.mutable_manifest() = (*version)->manifest;
    return result;
  };
  return FinishUnary(context, get(), response);
}

grpc::ServerWriteReactor<weightstore::v1::WatchVersionsResponse>*
WeightStoreServiceImpl::WatchVersions(grpc::CallbackServerContext* /*context*/,
                                      const weightstore::v1::WatchVersionsRequest* request) {
  if (absl::Status status = ValidateIdentifier("adapter_name", request->adapter_name());
      !status.ok()) {
    return new FinishedReactor<grpc::ServerWriteReactor<weightstore::v1::WatchVersionsResponse>>(
        ToGrpcStatus(status));
  }
  return new WatchReactor(*store_, watches_, request->adapter_name(), watch_registered_hook_);
}

grpc::ServerWriteReactor<weightstore::v1::FetchTensorsResponse>*
WeightStoreServiceImpl::FetchTensors(grpc::CallbackServerContext* /*context*/,
                                     const weightstore::v1::FetchTensorsRequest* request) {
  return new FetchReactor(*store_, *request);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::AcquireLease(
    grpc::CallbackServerContext* context, const weightstore::v1::AcquireLeaseRequest* request,
    weightstore::v1::AcquireLeaseResponse* response) {
  const auto acquire = [&]() -> absl::StatusOr<weightstore::v1::AcquireLeaseResponse> {
    if (request->holder().empty()) return InvalidField("holder", "holder is required");
    if (absl::Status status = CheckMaxBytes("holder", request->holder(), kMaxNameBytes);
        !status.ok()) {
      return status;
    }
    if (absl::Status status = ValidateIdentifier("adapter_name", request->adapter_name());
        !status.ok()) {
      return status;
    }
    absl::StatusOr<absl::Duration> ttl = LeaseTtl(request->has_ttl(), request->ttl(), "ttl");
    if (!ttl.ok()) return ttl.status();
    absl::StatusOr<AdapterStore::Lease> lease =
        store_->AcquireLease(request->adapter_name(), request->version(), request->holder(), *ttl);
    if (!lease.ok()) return lease.status();
    WeightStoreMetrics::Get().RecordTotals(store_->totals());
    weightstore::v1::AcquireLeaseResponse result;
    result.set_lease_id(lease->id);
    *result.mutable_expire_time() = ToTimestamp(lease->expire_time);
    return result;
  };
  return FinishUnary(context, acquire(), response);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::RenewLease(
    grpc::CallbackServerContext* context, const weightstore::v1::RenewLeaseRequest* request,
    weightstore::v1::RenewLeaseResponse* response) {
  const auto renew = [&]() -> absl::StatusOr<weightstore::v1::RenewLeaseResponse> {
    if (absl::Status status = ValidateIdentifier("lease_id", request->lease_id()); !status.ok()) {
      return status;
    }
    absl::StatusOr<absl::Duration> ttl = LeaseTtl(request->has_ttl(), request->ttl(), "ttl");
    if (!ttl.ok()) return ttl.status();
    absl::StatusOr<absl::Time> expire = store_->RenewLease(request->lease_id(), *ttl);
    if (!expire.ok()) return expire.status();
    weightstore::v1::RenewLeaseResponse result;
    *result.mutable_expire_time() = ToTimestamp(*expire);
    return result;
  };
  return FinishUnary(context, renew(), response);
}

grpc::ServerUnaryReactor* WeightStoreServiceImpl::ReleaseLease(
    grpc::CallbackServerContext* context, const weightstore::v1::ReleaseLeaseRequest* request,
    weightstore::v1::ReleaseLeaseResponse* response) {
  if (absl::Status status = ValidateIdentifier("lease_id", request->lease_id()); !status.ok()) {
    return FinishUnary(context, absl::StatusOr<weightstore::v1::ReleaseLeaseResponse>(status),
                       response);
  }
  store_->ReleaseLease(request->lease_id());
  WeightStoreMetrics::Get().RecordTotals(store_->totals());
  return FinishUnary(context,
                     absl::StatusOr<weightstore::v1::ReleaseLeaseResponse>(
                         weightstore::v1::ReleaseLeaseResponse()),
                     response);
}

}  // namespace tandem::weight_store
