#ifndef TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_
#define TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "services/trainer/rendezvous_values.h"

namespace tandem::trainer {

// Rank 0's own view of a group's rendezvous values: the Gloo store it joins its group through,
// in-process, while the other ranks reach the same values over TrainerRanksService
// (client/rendezvous_store.h). Reads wait for a key until `timeout`; failures are thrown as
// gloo::IoException, as Gloo's stores do.
class LocalRendezvousStore final : public gloo::rendezvous::Store {
 public:
  LocalRendezvousStore(RendezvousValues& values, std::string group, absl::Duration timeout)
      : values_(values), group_(std::move(group)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<char> Get(const std::string& key, absl::Time deadline);

  RendezvousValues& values_;
  const std::string group_;
  const absl::Duration timeout_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_LOCAL_RENDEZVOUS_STORE_H_
