#ifndef TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_
#define TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_

#include "services/trainer/communicator_ids.h"
#include "tandem/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// gRPC front end of CommunicatorIds (not owned; must outlive the service).
class TrainerRanksServiceImpl final : public v1::TrainerRanksService::CallbackService {
 public:
  explicit TrainerRanksServiceImpl(const CommunicatorIds& ids) : ids_(ids) {}

  grpc::ServerUnaryReactor* GetCommunicatorId(grpc::CallbackServerContext* context,
                                              const v1::GetCommunicatorIdRequest* request,
                                              v1::GetCommunicatorIdResponse* response) override;

 private:
  const CommunicatorIds& ids_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_TRAINER_RANKS_SERVICE_H_
