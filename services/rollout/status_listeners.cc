#include "services/rollout/status_listeners.h"

#include <utility>

namespace tandem::rollout {

int64_t StatusListeners::Add(const std::string& adapter, Listener listener) {
  absl::MutexLock lock(&mutex_);
  const int64_t id = next_id_++;
  Entry& entry = listeners_[id] = {.adapter = adapter, .listener = std::move(listener)};
  entry.listener.on_change();
  return id;
}

void StatusListeners::Remove(int64_t id) {
  absl::MutexLock lock(&mutex_);
  listeners_.erase(id);
}

void StatusListeners::Notify(const std::string& adapter) {
  absl::MutexLock lock(&mutex_);
  for (auto& [id, entry] : listeners_) {
    if (entry.adapter == adapter) entry.listener.on_change();
  }
}

void StatusListeners::EndAll() {
  std::map<int64_t, Entry> ended;
  {
    absl::MutexLock lock(&mutex_);
    ended.swap(listeners_);
  }
  // Outside the lock: ending a stream may end its call, whose end removes its listener.
  for (auto& [id, entry] : ended) entry.listener.on_end();
}

}  // namespace tandem::rollout
