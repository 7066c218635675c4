#ifndef TANDEM_COMMON_TESTING_ECHO_SERVICE_H_
#define TANDEM_COMMON_TESTING_ECHO_SERVICE_H_

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tandem/testing/echo.grpc.pb.h"

namespace tandem::testing {

// Echo service for runtime tests. Delayed answers run on their own thread, as a real
// handler doing slow work would, so a drain can be observed with calls in flight.
class EchoServiceImpl final : public EchoService::CallbackService {
 public:
  ~EchoServiceImpl() override {
    absl::MutexLock lock(&mutex_);
    for (std::thread& worker : workers_) worker.join();
  }

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoRequest* request,
                                 EchoResponse* response) override {
    return Answer(context, request, response);
  }

  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context, const EchoRequest* request,
                                   EchoResponse* response) override {
    return Answer(context, request, response);
  }

  std::atomic<int> calls_started{0};

 private:
  static int PreviousAttempts(const grpc::CallbackServerContext& context) {
    auto header = context.client_metadata().find("grpc-previous-rpc-attempts");
    if (header == context.client_metadata().end()) return 0;
    return std::stoi(std::string(header->second.data(), header->second.size()));
  }

  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const EchoRequest* request,
                                   EchoResponse* response) {
    calls_started.fetch_add(1);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (PreviousAttempts(*context) < request->fail_attempts()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "failing as asked"));
      return reactor;
    }
    absl::MutexLock lock(&mutex_);
    workers_.emplace_back([context, reactor, request, response] {
      // Sleep in slices and honour cancellation, as every handler must for drains to end.
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(request->delay_ms());
      while (std::chrono::steady_clock::now() < until) {
        if (context->IsCancelled()) {
          reactor->Finish(grpc::Status::CANCELLED);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      response->set_message(request->message());
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  absl::Mutex mutex_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_ECHO_SERVICE_H_
