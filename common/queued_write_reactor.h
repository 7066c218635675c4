#ifndef TANDEM_COMMON_QUEUED_WRITE_REACTOR_H_
#define TANDEM_COMMON_QUEUED_WRITE_REACTOR_H_

#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"

namespace tandem {

// A server-streaming reactor whose messages come from other threads (a scheduler, a store's
// listener). Messages queue and are written one at a time; the stream finishes exactly once.
// Producers hold a Sink, which OnDone disconnects, so they may outlive the reactor.
template <typename Response>
class QueuedWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  // What producers hold; thread-safe.
  class Sink {
   public:
    // Queues `message`; ignored once the stream has finished. False when the reactor is gone
    // (it could not even Discard the message): what the message holds is the caller's again.
    bool Write(Response message) {
      absl::MutexLock lock(&mutex_);
      if (reactor_ == nullptr) return false;
      reactor_->Offer(std::move(message));
      return true;
    }
    // Ends the stream after the write in progress; messages still queued are dropped.
    void Finish(const grpc::Status& status) {
      absl::MutexLock lock(&mutex_);
      if (reactor_ != nullptr) reactor_->Fail(status);
    }

   private:
    friend class QueuedWriteReactor;
    absl::Mutex mutex_;
    QueuedWriteReactor* reactor_ ABSL_GUARDED_BY(mutex_) = nullptr;
  };

  QueuedWriteReactor() : sink_(std::make_shared<Sink>()) { sink_->reactor_ = this; }

  const std::shared_ptr<Sink>& sink() const { return sink_; }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&sink_->mutex_);
    writing_ = false;
    // A write can complete after the call was cancelled (its bytes left first): the stream must
    // still finish, or the server's shutdown waits for it forever.
    if (!ok || cancelled_) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    } else if (pending_error_.has_value()) {
      FinishOnce(*pending_error_);
    } else if (!queue_.empty()) {
      WriteNext();
    } else if (last_written_) {
      FinishOnce(grpc::Status::OK);
    }
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&sink_->mutex_);
      cancelled_ = true;
      // A write in flight finishes the stream when it completes (OnWriteDone).
      if (!writing_) FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
    OnClientGone();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&sink_->mutex_);
      sink_->reactor_ = nullptr;
    }
    OnClientGone();
    delete this;
  }

 protected:
  // Puts `message` in the queue (called with the sink's lock held). Overrides may coalesce.
  virtual void Enqueue(std::deque<Response>& queue, Response message) {
    queue.push_back(std::move(message));
  }
  // Whether `message`, just written, ends the stream (OK once nothing else is queued).
  virtual bool IsLast(const Response& /*message*/) { return false; }
  // `message` will never be written: offered after the stream ended, or still queued when it
  // did (called with the sink's lock held). For messages that hold something to give back.
  virtual void Discard(const Response& /*message*/) {}
  // The client went away or the call ended; called without the lock, possibly twice.
  virtual void OnClientGone() {}

 private:
  void Offer(Response message) {
    if (finished_ || cancelled_ || pending_error_.has_value()) {
      Discard(message);
      return;
    }
    Enqueue(queue_, std::move(message));
    if (!writing_ && !queue_.empty()) WriteNext();
  }

  void Fail(const grpc::Status& status) {
    if (finished_ || pending_error_.has_value()) return;
    if (writing_) {
      pending_error_ = status;
    } else {
      FinishOnce(status);
    }
  }

  void WriteNext() {
    response_ = std::move(queue_.front());
    queue_.pop_front();
    last_written_ = IsLast(response_);
    writing_ = true;
    this->StartWrite(&response_);
  }

  void FinishOnce(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    for (const Response& message : queue_) Discard(message);
    queue_.clear();
    this->Finish(status);
  }

  const std::shared_ptr<Sink> sink_;
  std::deque<Response> queue_;
  Response response_;
  std::optional<grpc::Status> pending_error_;
  bool writing_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
  bool last_written_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_QUEUED_WRITE_REACTOR_H_
