#include "services/trainer/trainer_ranks_service.h"

#include "common/unary.h"

namespace tandem::trainer {

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetCommunicatorId(
    grpc::CallbackServerContext* context, const v1::GetCommunicatorIdRequest* request,
    v1::GetCommunicatorIdResponse* response) {
  absl::StatusOr<std::string> id =
      ids_.Get(request->group(), request->rank(), request->world_size());
  if (!id.ok()) {
    return FinishUnary<v1::GetCommunicatorIdResponse>(context, id.status(), response);
  }
  v1::GetCommunicatorIdResponse found;
  found.set_communicator_id(*std::move(id));
  return FinishUnary<v1::GetCommunicatorIdResponse>(context, std::move(found), response);
}

}  // namespace tandem::trainer
