#ifndef TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_
#define TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "tandem/v1/trainer_ranks.grpc.pb.h"

namespace tandem::trainer {

// Gloo's rendezvous store for one group, kept by rank 0's trainer (TrainerRanksService's
// rendezvous values): what GlooCommunicator::Create joins a group of CPU ranks through. Reads
// wait for a key until `timeout`; as Gloo's stores do, failures are thrown (gloo::IoException,
// naming the group and key), which GlooCommunicator::Create turns into a status.
class RendezvousStore final : public gloo::rendezvous::Store {
 public:
  RendezvousStore(v1::TrainerRanksService::StubInterface& stub, std::string group,
                  absl::Duration timeout)
      : stub_(stub), group_(std::move(group)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<char> Get(const std::string& key, absl::Time deadline);

  v1::TrainerRanksService::StubInterface& stub_;
  const std::string group_;
  const absl::Duration timeout_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CLIENT_RENDEZVOUS_STORE_H_
