#include "services/rollout/status_listeners.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace tandem::rollout {

void StatusListeners::TellLocked(std::map<int64_t, Entry>::iterator it, Ended& ended) {
  if (it->second.listener.on_change()) return;
  ended.emplace_back(std::move(it->second),
                     absl::NotFoundError(absl::StrCat("this replica no longer follows adapter '",
                                                      it->second.adapter, "'")));
  listeners_.erase(it);
}

// Outside the lock: ending a stream may end its call, whose end removes its listener.
void StatusListeners::End(Ended& ended) {
  for (auto& [entry, status] : ended) entry.listener.on_end(status);
}

int64_t StatusListeners::Add(const std::string& adapter, Listener listener) {
  Ended ended;
  int64_t id = 0;
  {
    absl::MutexLock lock(&mutex_);
    id = next_id_++;
    Entry entry{.adapter = adapter, .listener = std::move(listener)};
    if (ending_) {
      ended.emplace_back(std::move(entry),
                         absl::UnavailableError("the rollout replica is draining"));
    } else {
      TellLocked(listeners_.emplace(id, std::move(entry)).first, ended);
    }
  }
  End(ended);
  return id;
}

void StatusListeners::Remove(int64_t id) {
  absl::MutexLock lock(&mutex_);
  listeners_.erase(id);
}

void StatusListeners::Notify(const std::string& adapter) {
  Ended ended;
  {
    absl::MutexLock lock(&mutex_);
    for (auto it = listeners_.begin(); it != listeners_.end();) {
      auto next = std::next(it);
      if (it->second.adapter == adapter) TellLocked(it, ended);
      it = next;
    }
  }
  End(ended);
}

void StatusListeners::EndAll() {
  Ended ended;
  {
    absl::MutexLock lock(&mutex_);
    ending_ = true;
    for (auto& [id, entry] : listeners_) {
      ended.emplace_back(std::move(entry),
                         absl::UnavailableError("the rollout replica is draining"));
    }
    listeners_.clear();
  }
  End(ended);
}

}  // namespace tandem::rollout
