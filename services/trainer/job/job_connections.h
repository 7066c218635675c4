#ifndef TANDEM_SERVICES_TRAINER_JOB_JOB_CONNECTIONS_H_
#define TANDEM_SERVICES_TRAINER_JOB_JOB_CONNECTIONS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/rollout/client/sample_fan_out.h"
#include "services/router_replay/client/route_source.h"
#include "services/trainer/job/service_dialer.h"
#include "services/trainer/job/service_endpoints.h"
#include "services/weight_store/client/adapter_client.h"
#include "tandem/rollout/v1/rollout.grpc.pb.h"
#include "tandem/routerreplay/v1/router_replay.grpc.pb.h"

namespace tandem::trainer {

// The services one run of a job talks to, dialed once: its rollout replicas (and the fan-out of a
// step's Generate calls over them, cancelled when the run ends), the weight-store, and
// router-replay when this trainer rank has one.
class JobConnections {
 public:
  // Dials every service of `endpoints` through `dialer`. FAILED_PRECONDITION when the job
  // replays routes (`replays_routes`) and this rank has no router-replay: every rank reads its
  // own flags, and one without it would train without replay.
  static absl::StatusOr<std::unique_ptr<JobConnections>> Dial(const ServiceEndpoints& endpoints,
                                                              ServiceDialer& dialer,
                                                              absl::string_view job_id,
                                                              bool replays_routes);

  const std::vector<rollout::ReplicaStub>& replicas() const { return replicas_; }
  rollout::SampleFanOut& fan_out() { return fan_out_; }
  weight_store::WeightStoreStubs& weight_store() { return *weight_store_; }
  // Null without router-replay.
  routerreplay::v1::RouterReplayService::StubInterface* router_replay() {
    return router_replay_.get();
  }
  router_replay::RouteSource* route_source() { return route_source_.get(); }

 private:
  JobConnections() = default;

  std::vector<std::unique_ptr<rollout::v1::RolloutService::StubInterface>> rollouts_;
  std::vector<rollout::ReplicaStub> replicas_;  // rollouts_ by address.
  rollout::SampleFanOut fan_out_;
  std::unique_ptr<weight_store::WeightStoreStubs> weight_store_;
  std::unique_ptr<routerreplay::v1::RouterReplayService::StubInterface> router_replay_;
  std::unique_ptr<router_replay::RouteSource> route_source_;  // Over router_replay_.
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_JOB_CONNECTIONS_H_
