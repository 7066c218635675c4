#include "common/parallel_tasks.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ParallelTasksTest, RunsEveryTaskOnce) {
  std::atomic<int> runs[100] = {};
  ParallelTasks tasks;
  for (std::atomic<int>& count : runs) {
    tasks.Add([&count] {
      ++count;
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(tasks.Finish().ok());
  for (const std::atomic<int>& count : runs) EXPECT_EQ(count.load(), 1);
}

TEST(ParallelTasksTest, TheHelperRunsTasksWhileTheCallerIsBusy) {
  absl::Notification ran_elsewhere;
  const std::thread::id caller = std::this_thread::get_id();
  ParallelTasks tasks;
  tasks.Add([&] {
    if (std::this_thread::get_id() != caller) ran_elsewhere.Notify();
    return absl::OkStatus();
  });
  // The caller has not called Finish: only the helper can run it.
  EXPECT_TRUE(ran_elsewhere.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(tasks.Finish().ok());
}

TEST(ParallelTasksTest, FinishTakesItsShareOfTheWork) {
  // The helper is held in the first task until the second has run: only the caller can run it.
  absl::Notification helper_busy;
  absl::Notification second_ran;
  std::atomic<bool> second_ran_on_caller = false;
  const std::thread::id caller = std::this_thread::get_id();
  ParallelTasks tasks;
  tasks.Add([&] {
    helper_busy.Notify();
    // Bounded, so that a broken Finish fails the test instead of hanging it.
    second_ran.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::OkStatus();
  });
  helper_busy.WaitForNotification();
  tasks.Add([&] {
    second_ran_on_caller = std::this_thread::get_id() == caller;
    second_ran.Notify();
    return absl::OkStatus();
  });
  EXPECT_TRUE(tasks.Finish().ok());
  EXPECT_TRUE(second_ran_on_caller.load());
}

TEST(ParallelTasksTest, RunOneRunsTheOldestWaitingTaskOnTheCaller) {
  absl::Notification helper_busy, release;
  std::vector<int> order;
  absl::Mutex order_mutex;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> ran_on_caller = false;
  ParallelTasks tasks;
  tasks.Add([&] {
    helper_busy.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  helper_busy.WaitForNotification();
  for (int i = 1; i <= 2; ++i) {
    tasks.Add([&, i] {
      absl::MutexLock lock(&order_mutex);
      order.push_back(i);
      if (i == 1) ran_on_caller = std::this_thread::get_id() == caller;
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(tasks.RunOne());
  EXPECT_TRUE(ran_on_caller.load());
  EXPECT_TRUE(tasks.RunOne());
  EXPECT_FALSE(tasks.RunOne());  // Nothing waits: the helper holds the first task.
  release.Notify();
  EXPECT_TRUE(tasks.Finish().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(ParallelTasksTest, ReturnsTheFirstErrorAndStillRunsEveryTask) {
  absl::Notification release;
  std::atomic<int> later_runs = 0;
  ParallelTasks tasks;
  tasks.Add([&] {
    release.WaitForNotification();
    return absl::DataLossError("tensor 3: checksum mismatch");
  });
  for (int i = 0; i < 10; ++i) {
    tasks.Add([&] {
      ++later_runs;
      return absl::InternalError("later");
    });
  }
  release.Notify();
  const absl::Status status = tasks.Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "tensor 3: checksum mismatch");
  EXPECT_EQ(later_runs.load(), 10);
}

TEST(ParallelTasksTest, FinishTwiceAndTasksAddedAfterFinish) {
  ParallelTasks tasks;
  tasks.Add([] { return absl::AbortedError("first"); });
  EXPECT_EQ(tasks.Finish().message(), "first");
  EXPECT_EQ(tasks.Finish().message(), "first");
  bool ran = false;
  tasks.Add([&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_TRUE(ran);  // Run on the caller: no helper is left.
}

TEST(ParallelTasksTest, DestructionWithoutFinishWaitsForTheTasks) {
  std::atomic<int> runs = 0;
  {
    ParallelTasks tasks;
    for (int i = 0; i < 5; ++i) {
      tasks.Add([&] {
        absl::SleepFor(absl::Milliseconds(2));
        ++runs;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(runs.load(), 5);
}

}  // namespace
}  // namespace tandem
