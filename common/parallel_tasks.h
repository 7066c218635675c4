#ifndef TANDEM_COMMON_PARALLEL_TASKS_H_
#define TANDEM_COMMON_PARALLEL_TASKS_H_

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

// Work handed off while the caller goes on with its own: a helper thread runs added tasks in
// order, and Finish() has the caller take its share of what is left. A fetch uses it to copy
// and checksum what has arrived while it waits for what has not.
//
// The first failure stops the work: once a task has returned an error, no task starts again.
// Those not yet started, and those added later, are destroyed without running (outside the
// lock), while tasks already running finish. So a caller that waits on what its tasks signal
// must signal from what a task holds (its destructor), not only from the task's body.
class ParallelTasks {
 public:
  ParallelTasks();
  ~ParallelTasks();  // Finishes, if the owner did not.

  ParallelTasks(const ParallelTasks&) = delete;
  ParallelTasks& operator=(const ParallelTasks&) = delete;

  // Queues `task`; after Finish, runs it on the calling thread (its error then only counts for
  // a later Finish). After a failure, destroys it instead.
  void Add(absl::AnyInvocable<absl::Status() &&> task);
  // Runs the oldest task not yet started on the calling thread, if there is one: how a caller
  // that waits on what its tasks signal helps instead of idling. False if none was waiting
  // (none ever is after a failure).
  bool RunOne();
  // Runs tasks on the calling thread too until none is left or one failed, waits for the
  // helper's task to finish, and returns the first error. Calling it again returns the same.
  absl::Status Finish();

 private:
  // Runs queued tasks until the queue is empty and, if `until_finishing`, Finish was called.
  void Drain(bool until_finishing);
  // Runs `task`; if it fails, records the error and drops the tasks not yet started.
  void Run(absl::AnyInvocable<absl::Status() &&> task);

  absl::Mutex mutex_;
  std::deque<absl::AnyInvocable<absl::Status() &&>> queue_ ABSL_GUARDED_BY(mutex_);
  bool finishing_ ABSL_GUARDED_BY(mutex_) = false;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;     // The helper has been joined.
  absl::Status first_error_ ABSL_GUARDED_BY(mutex_);  // Not OK: nothing starts any more.
  std::thread helper_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_PARALLEL_TASKS_H_
