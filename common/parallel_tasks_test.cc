#include "common/parallel_tasks.h"

#include <atomic>
#include <memory>
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

// A task fails on the caller (RunOne) while the helper runs another: the tasks not yet started
// never run, the running one finishes before Finish returns, and Finish returns the first error.
TEST(ParallelTasksTest, AFailureStopsTheTasksNotYetStarted) {
  absl::Notification helper_busy, release;
  std::atomic<bool> helper_done = false;
  std::atomic<int> later_runs = 0;
  ParallelTasks tasks;
  tasks.Add([&] {
    helper_busy.Notify();
    release.WaitForNotification();
    helper_done = true;
    return absl::InternalError("running when the first failed");
  });
  helper_busy.WaitForNotification();
  tasks.Add([] { return absl::DataLossError("tensor 3: checksum mismatch"); });
  for (int i = 0; i < 10; ++i) {
    tasks.Add([&] {
      ++later_runs;
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(tasks.RunOne());   // The failing task, on this thread.
  EXPECT_FALSE(tasks.RunOne());  // The ten after it are gone.
  tasks.Add([&] {
    ++later_runs;
    return absl::OkStatus();
  });
  EXPECT_FALSE(tasks.RunOne());  // Added after the failure: never queued.
  EXPECT_FALSE(helper_done.load());
  release.Notify();
  const absl::Status status = tasks.Finish();
  EXPECT_TRUE(helper_done.load());  // The running task finished before Finish returned.
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "tensor 3: checksum mismatch");
  EXPECT_EQ(later_runs.load(), 0);
}

// Notifies when the last task holding it goes, run or not.
class NotifyWhenGone {
 public:
  explicit NotifyWhenGone(absl::Notification& gone) : gone_(gone) {}
  ~NotifyWhenGone() { gone_.Notify(); }

 private:
  absl::Notification& gone_;
};

// The same when the failure is the helper's: none of the tasks queued behind it start, neither
// on the helper nor in Finish.
TEST(ParallelTasksTest, AFailureOnTheHelperStopsTheTasksNotYetStarted) {
  absl::Notification helper_busy, release, later_gone;
  std::atomic<int> later_runs = 0;
  ParallelTasks tasks;
  tasks.Add([&] {
    helper_busy.Notify();
    release.WaitForNotification();
    return absl::AbortedError("first");
  });
  helper_busy.WaitForNotification();
  // Taken by this thread's RunOne: lets the helper's task fail, and returns once the ten tasks
  // behind it are gone (they would be gone too after running, so a count tells which).
  tasks.Add([&] {
    release.Notify();
    later_gone.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::OkStatus();
  });
  {
    const auto gone = std::make_shared<NotifyWhenGone>(later_gone);
    for (int i = 0; i < 10; ++i) {
      tasks.Add([&later_runs, gone] {
        ++later_runs;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_TRUE(tasks.RunOne());
  EXPECT_TRUE(later_gone.HasBeenNotified());
  EXPECT_EQ(tasks.Finish().message(), "first");
  EXPECT_EQ(later_runs.load(), 0);
}

// Tasks that never run are destroyed, so what they hold is let go: a caller that waits on what
// its tasks signal can signal from what the task holds and still never wait forever.
TEST(ParallelTasksTest, TasksThatNeverRunAreDestroyedAtOnce) {
  absl::Notification helper_busy, release;
  ParallelTasks tasks;
  tasks.Add([&] {
    helper_busy.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  helper_busy.WaitForNotification();
  tasks.Add([] { return absl::DataLossError("bad"); });
  const auto held = std::make_shared<int>(0);
  for (int i = 0; i < 3; ++i) {
    tasks.Add([held] { return absl::OkStatus(); });
  }
  EXPECT_EQ(held.use_count(), 4);
  EXPECT_TRUE(tasks.RunOne());  // Fails; the three behind it are dropped.
  EXPECT_EQ(held.use_count(), 1);
  tasks.Add([held] { return absl::OkStatus(); });  // Dropped at once, too.
  EXPECT_EQ(held.use_count(), 1);
  release.Notify();
  EXPECT_EQ(tasks.Finish().code(), absl::StatusCode::kDataLoss);
}

TEST(ParallelTasksTest, WithoutAFailureEveryTaskRunsWhateverTheOrder) {
  std::atomic<int> runs = 0;
  ParallelTasks tasks;
  for (int i = 0; i < 50; ++i) {
    tasks.Add([&] {
      ++runs;
      return absl::OkStatus();
    });
    if (i % 7 == 0) tasks.RunOne();
  }
  EXPECT_TRUE(tasks.Finish().ok());
  EXPECT_EQ(runs.load(), 50);
}

TEST(ParallelTasksTest, FinishTwiceAndTasksAddedAfterFinish) {
  ParallelTasks tasks;
  tasks.Add([] { return absl::OkStatus(); });
  EXPECT_TRUE(tasks.Finish().ok());
  EXPECT_TRUE(tasks.Finish().ok());
  bool ran = false;
  tasks.Add([&] {
    ran = true;
    return absl::AbortedError("after");
  });
  EXPECT_TRUE(ran);  // Run on the caller: no helper is left.
  // Its error counts for a later Finish.
  EXPECT_EQ(tasks.Finish().message(), "after");
  bool ran_after_failure = false;
  tasks.Add([&] {
    ran_after_failure = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(ran_after_failure);  // Not started after a failure, also after Finish.
}

TEST(ParallelTasksTest, FinishAfterAFailureReturnsItEveryTime) {
  ParallelTasks tasks;
  tasks.Add([] { return absl::AbortedError("first"); });
  EXPECT_EQ(tasks.Finish().message(), "first");
  EXPECT_EQ(tasks.Finish().message(), "first");
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
