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

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::SetRendezvousValue(
    grpc::CallbackServerContext* context, const v1::SetRendezvousValueRequest* request,
    v1::SetRendezvousValueResponse* response) {
  const absl::Status status =
      rendezvous_.Set(request->group(), request->key(), std::string(request->value()));
  if (!status.ok()) return FinishUnary<v1::SetRendezvousValueResponse>(context, status, response);
  return FinishUnary<v1::SetRendezvousValueResponse>(context, v1::SetRendezvousValueResponse(),
                                                     response);
}

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetRendezvousValue(
    grpc::CallbackServerContext* context, const v1::GetRendezvousValueRequest* request,
    v1::GetRendezvousValueResponse* response) {
  absl::StatusOr<std::string> value = rendezvous_.Get(request->group(), request->key());
  if (!value.ok()) {
    return FinishUnary<v1::GetRendezvousValueResponse>(context, value.status(), response);
  }
  v1::GetRendezvousValueResponse found;
  found.set_value(*std::move(value));
  return FinishUnary<v1::GetRendezvousValueResponse>(context, std::move(found), response);
}

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetAssignment(
    grpc::CallbackServerContext* context, const v1::GetAssignmentRequest* request,
    v1::GetAssignmentResponse* response) {
  absl::StatusOr<v1::GetAssignmentResponse> assignment = roster_.Take(request->rank());
  if (!assignment.ok()) {
    return FinishUnary<v1::GetAssignmentResponse>(context, assignment.status(), response);
  }
  return FinishUnary<v1::GetAssignmentResponse>(context, *std::move(assignment), response);
}

}  // namespace tandem::trainer
