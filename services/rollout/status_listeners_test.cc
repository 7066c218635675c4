#include "services/rollout/status_listeners.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::rollout {
namespace {

struct Heard {
  std::vector<std::string> events;
  StatusListeners::Listener For(const std::string& who) {
    return {.on_change = [this, who] { events.push_back(who + " changed"); },
            .on_end = [this, who] { events.push_back(who + " ended"); }};
  }
};

TEST(StatusListenersTest, AListenerHearsTheStatusNowThenItsAdaptersChanges) {
  StatusListeners listeners;
  Heard heard;
  listeners.Add("a", heard.For("a1"));
  listeners.Add("b", heard.For("b1"));
  listeners.Notify("a");
  listeners.Notify("c");
  EXPECT_EQ(heard.events, (std::vector<std::string>{"a1 changed", "b1 changed", "a1 changed"}));
}

TEST(StatusListenersTest, ARemovedListenerHearsNothingMore) {
  StatusListeners listeners;
  Heard heard;
  const int64_t id = listeners.Add("a", heard.For("a1"));
  listeners.Add("a", heard.For("a2"));
  listeners.Remove(id);
  listeners.Remove(id);  // Idempotent: a call may end twice.
  listeners.Notify("a");
  EXPECT_EQ(heard.events, (std::vector<std::string>{"a1 changed", "a2 changed", "a2 changed"}));
}

TEST(StatusListenersTest, EndAllEndsEveryListenerOnce) {
  StatusListeners listeners;
  Heard heard;
  listeners.Add("a", heard.For("a1"));
  listeners.Add("b", heard.For("b1"));
  heard.events.clear();
  listeners.EndAll();
  listeners.Notify("a");
  listeners.EndAll();
  EXPECT_EQ(heard.events, (std::vector<std::string>{"a1 ended", "b1 ended"}));
}

}  // namespace
}  // namespace tandem::rollout
