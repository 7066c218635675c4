#ifndef TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
#define TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/open_streams.h"
#include "common/periodic_thread.h"
#include "services/weight_store/adapter_store.h"
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

// gRPC front end of the weight-store: converts messages and statuses around AdapterStore (state),
// reshard (read plans) and tensor assembly (the gRPC data path).
class WeightStoreServiceImpl final : public weightstore::v1::WeightStoreService::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<WeightStoreServiceImpl>> Create(
      const WeightStoreOptions& options);

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
  grpc::ServerUnaryReactor* GetReadPlan(grpc::CallbackServerContext* context,
                                        const weightstore::v1::GetReadPlanRequest* request,
                                        weightstore::v1::GetReadPlanResponse* response) override;
  grpc::ServerUnaryReactor* ExchangeUcxEndpoint(
      grpc::CallbackServerContext* context,
      const weightstore::v1::ExchangeUcxEndpointRequest* request,
      weightstore::v1::ExchangeUcxEndpointResponse* response) override;
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
  absl::StatusOr<weightstore::v1::GetReadPlanResponse> ReadPlan(
      const weightstore::v1::GetReadPlanRequest& request);
  // The plan of a leased version with every tensor's checksum (a pass over its bytes).
  absl::StatusOr<weightstore::v1::GetReadPlanResponse> PlanWithChecksums(
      const weightstore::v1::GetReadPlanRequest& request, const CommittedVersion& version) const;

  std::unique_ptr<transfer::UcxWorker>
      ucx_;  // Declared first: outlives the store's registered memory.
  std::unique_ptr<AdapterStore> store_;
  absl::Mutex mutex_;
  // Read plans with checksums, per (version, layout, names): checksumming costs a pass over
  // the bytes, and every replica of a deployment asks for the same few layouts.
  absl::flat_hash_map<std::string, weightstore::v1::GetReadPlanResponse> plan_cache_
      ABSL_GUARDED_BY(mutex_);
  // Plans being computed: the replicas that a new version's announcement wakes ask for the same
  // plan at once, and all but the first wait for it instead of computing it again.
  struct PlanInFlight {
    absl::Notification done;
    absl::StatusOr<weightstore::v1::GetReadPlanResponse> plan;
  };
  absl::flat_hash_map<std::string, std::shared_ptr<PlanInFlight>> plans_in_flight_
      ABSL_GUARDED_BY(mutex_);
  std::unique_ptr<PeriodicThread> sweeper_;  // Expiry and retention; stops before the store goes.
  OpenStreams<weightstore::v1::WatchVersionsResponse> watches_;
  std::function<void()> watch_registered_hook_;  // WeightStoreOptions::watch_registered_hook.
};

}  // namespace tandem::weight_store

#endif  // TANDEM_SERVICES_WEIGHT_STORE_WEIGHT_STORE_SERVICE_H_
