#include "common/parallel_tasks.h"

#include <utility>

namespace tandem {

ParallelTasks::ParallelTasks() : helper_([this] { Drain(/*until_finishing=*/true); }) {}

ParallelTasks::~ParallelTasks() { Finish().IgnoreError(); }

void ParallelTasks::Add(absl::AnyInvocable<absl::Status() &&> task) {
  {
    absl::MutexLock lock(&mutex_);
    // After a failure `task` never runs; it is destroyed on return, once the lock is released.
    if (!first_error_.ok()) return;
    if (!finished_) {
      queue_.push_back(std::move(task));
      return;
    }
  }
  Run(std::move(task));  // After Finish nobody else would.
}

absl::Status ParallelTasks::Finish() {
  {
    absl::MutexLock lock(&mutex_);
    if (finished_) return first_error_;
    finishing_ = true;
  }
  Drain(/*until_finishing=*/false);
  helper_.join();
  absl::MutexLock lock(&mutex_);
  finished_ = true;
  return first_error_;
}

bool ParallelTasks::RunOne() {
  absl::AnyInvocable<absl::Status() &&> task;
  {
    absl::MutexLock lock(&mutex_);
    if (queue_.empty()) return false;
    task = std::move(queue_.front());
    queue_.pop_front();
  }
  Run(std::move(task));
  return true;
}

void ParallelTasks::Drain(bool until_finishing) {
  const auto ready = [this, until_finishing]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return !queue_.empty() || finishing_ || !until_finishing;
  };
  while (true) {
    absl::AnyInvocable<absl::Status() &&> task;
    {
      absl::MutexLock lock(&mutex_, absl::Condition(&ready));
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Run(std::move(task));
  }
}

void ParallelTasks::Run(absl::AnyInvocable<absl::Status() &&> task) {
  absl::Status status = std::move(task)();
  if (status.ok()) return;
  std::deque<absl::AnyInvocable<absl::Status() &&>> dropped;
  {
    absl::MutexLock lock(&mutex_);
    first_error_.Update(status);
    dropped.swap(queue_);
  }
  // `dropped` goes here, without the lock: what the tasks hold may signal their caller.
}

}  // namespace tandem
