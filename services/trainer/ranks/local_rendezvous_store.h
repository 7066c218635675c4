#ifndef TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_
#define TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/trainer/client/deadline_store.h"
#include "services/trainer/ranks/rendezvous_values.h"

namespace tandem::trainer {

// Rank 0's own view of a group's rendezvous values: the Gloo store it joins its group through,
// in-process, while the other ranks reach the same values over TrainerRanksService
// (client/rendezvous_store.h). Reads wait for a key until `timeout`; failures are thrown as
// gloo::IoException, as Gloo's stores do.
class LocalRendezvousStore final : public DeadlineStore {
 public:
  LocalRendezvousStore(RendezvousValues& values, std::string group, absl::Duration timeout)
      : DeadlineStore(timeout), values_(values), group_(std::move(group)) {}

  void set(const std::string& key, const std::vector<char>& data) override;

 private:
  std::vector<char> Get(const std::string& key, absl::Time deadline) override;

  RendezvousValues& values_;
  const std::string group_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_
