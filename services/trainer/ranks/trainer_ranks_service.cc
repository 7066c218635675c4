#include "services/trainer/ranks/trainer_ranks_service.h"

#include "common/unary.h"

namespace tandem::trainer {

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetCommunicatorId(
    grpc::CallbackServerContext* context, const internal::v1::GetCommunicatorIdRequest* request,
    internal::v1::GetCommunicatorIdResponse* response) {
  absl::StatusOr<std::string> id =
      ids_.Get(request->group(), request->rank(), request->world_size());
  if (!id.ok()) {
    return FinishUnary<internal::v1::GetCommunicatorIdResponse>(context, id.status(), response);
  }
  internal::v1::GetCommunicatorIdResponse found;
  found.set_communicator_id(*std::move(id));
  return FinishUnary<internal::v1::GetCommunicatorIdResponse>(context, std::move(found), response);
}

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::SetRendezvousValue(
    grpc::CallbackServerContext* context, const internal::v1::SetRendezvousValueRequest* request,
    internal::v1::SetRendezvousValueResponse* response) {
  const absl::Status status =
      rendezvous_.Set(request->group(), request->key(), std::string(request->value()));
  if (!status.ok())
    return FinishUnary<internal::v1::SetRendezvousValueResponse>(context, status, response);
  return FinishUnary<internal::v1::SetRendezvousValueResponse>(
      context, internal::v1::SetRendezvousValueResponse(), response);
}

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetRendezvousValue(
    grpc::CallbackServerContext* context, const internal::v1::GetRendezvousValueRequest* request,
    internal::v1::GetRendezvousValueResponse* response) {
  absl::StatusOr<std::string> value = rendezvous_.Get(request->group(), request->key());
  if (!value.ok()) {
    return FinishUnary<internal::v1::GetRendezvousValueResponse>(context, value.status(), response);
  }
  internal::v1::GetRendezvousValueResponse found;
  found.set_value(*std::move(value));
  return FinishUnary<internal::v1::GetRendezvousValueResponse>(context, std::move(found), response);
}

grpc::ServerUnaryReactor* TrainerRanksServiceImpl::GetAssignment(
    grpc::CallbackServerContext* context, const internal::v1::GetAssignmentRequest* request,
    internal::v1::GetAssignmentResponse* response) {
  absl::StatusOr<internal::v1::GetAssignmentResponse> assignment = roster_.Take(request->rank());
  if (!assignment.ok()) {
    return FinishUnary<internal::v1::GetAssignmentResponse>(context, assignment.status(), response);
  }
  return FinishUnary<internal::v1::GetAssignmentResponse>(context, *std::move(assignment),
                                                          response);
}

}  // namespace tandem::trainer
