#include "services/rollout/status_listeners.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::rollout {
namespace {

struct Heard {
  std::vector<std::string> events;
  bool followed = true;  // What every listener's on_change answers.
  StatusListeners::Listener For(const std::string& who) {
    return {.on_change =
                [this, who] {
                  events.push_back(who + " changed");
                  return followed;
                },
            .on_end =
                [this, who](const absl::Status& status) {
                  events.push_back(who + " ended " + absl::StatusCodeToString(status.code()));
                }};
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

TEST(StatusListenersTest, AListenerWithNothingMoreToTellEndsNotFound) {
  StatusListeners listeners;
  Heard heard;
  listeners.Add("a", heard.For("a1"));
  heard.followed = false;  // The adapter was unfollowed.
  listeners.Notify("a");
  listeners.Notify("a");
  EXPECT_EQ(heard.events,
            (std::vector<std::string>{"a1 changed", "a1 changed", "a1 ended NOT_FOUND"}));
  heard.events.clear();
  listeners.Add("a", heard.For("a2"));  // Added after the adapter went: ended at once.
  EXPECT_EQ(heard.events, (std::vector<std::string>{"a2 changed", "a2 ended NOT_FOUND"}));
}

TEST(StatusListenersTest, EndAllEndsEveryListenerOnceAndEveryLaterOneAtOnce) {
  StatusListeners listeners;
  Heard heard;
  listeners.Add("a", heard.For("a1"));
  listeners.Add("b", heard.For("b1"));
  heard.events.clear();
  listeners.EndAll();
  listeners.Notify("a");
  listeners.EndAll();
  listeners.Add("a", heard.For("late"));
  EXPECT_EQ(heard.events, (std::vector<std::string>{"a1 ended UNAVAILABLE", "b1 ended UNAVAILABLE",
                                                    "late ended UNAVAILABLE"}));
}

}  // namespace
}  // namespace tandem::rollout
