#ifndef TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_
#define TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/trainer/client/deadline_store.h"
#include "tandem/internal/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// Gloo's rendezvous store for one group, kept by rank 0's trainer (TrainerRanksService's
// rendezvous values): what GlooCommunicator::Create joins a group of CPU ranks through. Reads
// wait for a key until `timeout`; as Gloo's stores do, failures are thrown (gloo::IoException,
// naming the group and key), which GlooCommunicator::Create turns into a status.
class RendezvousStore final : public DeadlineStore {
 public:
  RendezvousStore(internal::v1::TrainerRanksService::StubInterface& stub, std::string group,
                  absl::Duration timeout)
      : DeadlineStore(timeout), stub_(stub), group_(std::move(group)) {}

  void set(const std::string& key, const std::vector<char>& data) override;

 private:
  std::vector<char> Get(const std::string& key, absl::Time deadline) override;

  internal::v1::TrainerRanksService::StubInterface& stub_;
  const std::string group_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_
