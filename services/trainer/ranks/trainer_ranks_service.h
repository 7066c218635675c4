#ifndef TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_

#include "services/trainer/ranks/communicator_ids.h"
#include "services/trainer/ranks/rank_roster.h"
#include "services/trainer/ranks/rendezvous_values.h"
#include "tandem/internal/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// gRPC front end of CommunicatorIds, RendezvousValues and RankRoster (not owned; must outlive
// the service).
class TrainerRanksServiceImpl final : public internal::v1::TrainerRanksService::CallbackService {
 public:
  TrainerRanksServiceImpl(const CommunicatorIds& ids, RendezvousValues& rendezvous,
                          RankRoster& roster)
      : ids_(ids), rendezvous_(rendezvous), roster_(roster) {}

  grpc::ServerUnaryReactor* GetCommunicatorId(
      grpc::CallbackServerContext* context, const internal::v1::GetCommunicatorIdRequest* request,
      internal::v1::GetCommunicatorIdResponse* response) override;
  grpc::ServerUnaryReactor* SetRendezvousValue(
      grpc::CallbackServerContext* context, const internal::v1::SetRendezvousValueRequest* request,
      internal::v1::SetRendezvousValueResponse* response) override;
  grpc::ServerUnaryReactor* GetRendezvousValue(
      grpc::CallbackServerContext* context, const internal::v1::GetRendezvousValueRequest* request,
      internal::v1::GetRendezvousValueResponse* response) override;
  grpc::ServerUnaryReactor* GetAssignment(grpc::CallbackServerContext* context,
                                          const internal::v1::GetAssignmentRequest* request,
                                          internal::v1::GetAssignmentResponse* response) override;

 private:
  const CommunicatorIds& ids_;
  RendezvousValues& rendezvous_;
  RankRoster& roster_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_
