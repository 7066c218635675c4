#ifndef TANDEM_SERVICES_TRAINER_CLIENT_DEADLINE_STORE_H_
#define TANDEM_SERVICES_TRAINER_CLIENT_DEADLINE_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"

namespace tandem::trainer {

// A Gloo rendezvous store whose reads wait for a key until a deadline (the store's timeout, or
// the one Gloo passes): what both ends of a group's rendezvous share -- rank 0 reading its own
// values in-process, the other ranks reading them over TrainerRanksService.
class DeadlineStore : public gloo::rendezvous::Store {
 public:
  explicit DeadlineStore(absl::Duration timeout) : timeout_(timeout) {}

  std::vector<char> get(const std::string& key) final { return Get(key, absl::Now() + timeout_); }
  void wait(const std::vector<std::string>& keys) final {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) final {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    for (const std::string& key : keys) Get(key, deadline);
  }

 protected:
  absl::Duration timeout() const { return timeout_; }
  // How a store fails: Gloo's exception, naming the group and key.
  [[noreturn]] static void Fail(const std::string& group, const std::string& key,
                                const absl::Status& status) {
    throw gloo::IoException(
        absl::StrCat("rendezvous of group ", group, ", key ", key, ": ", status.ToString()));
  }
  // The key's value once it is set; throws gloo::IoException (as Gloo's stores do) when it is
  // not set by `deadline` or cannot be read.
  virtual std::vector<char> Get(const std::string& key, absl::Time deadline) = 0;

 private:
  const absl::Duration timeout_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_CLIENT_DEADLINE_STORE_H_
