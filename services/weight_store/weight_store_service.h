#ifndef TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
#define TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/open_streams.h"
#include "common/periodic_thread.h"
#include "common/server.h"
#include "services/weight_store/adapter_store.h"
#include "services/weight_store/weight_store_ucx_service.h"
#include "tandem/weightstore/v1/weight_store.grpc.pb.h"
#include "transfer/ucx_transport.h"

namespace tandem::weight_store {

struct WeightStoreOptions {
  std::string data_dir;
  int keep_versions = 3;
  absl::Duration upload_expiry = absl::Minutes(15);
  bool enable_ucx = true;
  transfer::UcxOptions ucx;
  absl::Duration sweep_interval = absl::Seconds(1);
  // Tests only: runs in each WatchVersions call between registering the stream's watcher and
  // reading the newest version, the window where a commit reaches the stream both as an
  // announcement and as the newest version.
  std::function<void()> watch_registered_hook;
};

// gRPC front end of the weight-store's public API: converts messages and statuses around
// AdapterStore (state) and tensor assembly (the gRPC data path). The UCX data plane is a second
// front end over the same store (NewUcxService).
class WeightStoreServiceImpl final : public weightstore::v1::WeightStoreService::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<WeightStoreServiceImpl>> Create(
      const WeightStoreOptions& options);

  // The front end of tandem.internal.v1.WeightStoreUcxService over this service's store and
  // UCX worker.
  std::unique_ptr<WeightStoreUcxServiceImpl> NewUcxService() const;

  grpc::ServerUnaryReactor* BeginPublish(grpc::CallbackServerContext* context,
                                         const weightstore::v1::BeginPublishRequest* request,
                                         weightstore::v1::BeginPublishResponse* response) override;
  grpc::ServerReadReactor<weightstore::v1::PutShardRequest>* PutShard(
      grpc::CallbackServerContext* context, weightstore::v1::PutShardResponse* response) override;
  grpc::ServerUnaryReactor* CommitPublish(
      grpc::CallbackServerContext* context, const weightstore::v1::CommitPublishRequest* request,
      weightstore::v1::CommitPublishResponse* response) override;
  grpc::ServerUnaryReactor* AbortPublish(grpc::CallbackServerContext* context,
                                         const weightstore::v1::AbortPublishRequest* request,
                                         weightstore::v1::AbortPublishResponse* response) override;
  grpc::ServerUnaryReactor* GetManifest(grpc::CallbackServerContext* context,
                                        const weightstore::v1::GetManifestRequest* request,
                                        weightstore::v1::GetManifestResponse* response) override;
  // Tests only: the store behind the service.
  AdapterStore& store_for_testing() { return *store_; }

  // For a server drain: ends every WatchVersions stream with UNAVAILABLE (watch again).
  void Drain() { watches_.EndAll(DrainingStatus("weight-store")); }

  grpc::ServerWriteReactor<weightstore::v1::WatchVersionsResponse>* WatchVersions(
      grpc::CallbackServerContext* context,
      const weightstore::v1::WatchVersionsRequest* request) override;
  grpc::ServerWriteReactor<weightstore::v1::FetchTensorsResponse>* FetchTensors(
      grpc::CallbackServerContext* context,
      const weightstore::v1::FetchTensorsRequest* request) override;
  grpc::ServerUnaryReactor* AcquireLease(grpc::CallbackServerContext* context,
                                         const weightstore::v1::AcquireLeaseRequest* request,
                                         weightstore::v1::AcquireLeaseResponse* response) override;
  grpc::ServerUnaryReactor* RenewLease(grpc::CallbackServerContext* context,
                                       const weightstore::v1::RenewLeaseRequest* request,
                                       weightstore::v1::RenewLeaseResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseLease(grpc::CallbackServerContext* context,
                                         const weightstore::v1::ReleaseLeaseRequest* request,
                                         weightstore::v1::ReleaseLeaseResponse* response) override;

 private:
  WeightStoreServiceImpl() = default;
  // Shared with the UCX data plane's front end (NewUcxService). Declared first: the worker
  // outlives the store's registered memory.
  std::shared_ptr<transfer::UcxWorker> ucx_;
  std::shared_ptr<AdapterStore> store_;
  std::unique_ptr<PeriodicThread> sweeper_;  // Expiry and retention; stops before the store goes.
  OpenStreams<weightstore::v1::WatchVersionsResponse> watches_;
  std::function<void()> watch_registered_hook_;  // WeightStoreOptions::watch_registered_hook.
};

// The weight-store as a server hosts it: the public API (drained with the server) and the UCX
// data plane, over one store.
absl::StatusOr<std::vector<HostedService>> WeightStoreServices(const WeightStoreOptions& options);

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
