#include "services/rollout/version_watch.h"

#include <utility>

namespace tandem::rollout {

// Deletes itself when the call is done; keeps the watch (and so its ClientContext) alive until
// then.
class VersionWatch::Reactor final
    : public grpc::ClientReadReactor<weightstore::v1::WatchVersionsResponse> {
 public:
  Reactor(std::shared_ptr<VersionWatch> watch, OnEvent on_event, OnEnd on_end, CallTracker& calls)
      : call_(calls),
        watch_(std::move(watch)),
        on_event_(std::move(on_event)),
        on_end_(std::move(on_end)) {}

  void Begin(weightstore::v1::WeightStoreService::StubInterface& stub, const std::string& adapter) {
    request_.set_adapter_name(adapter);
    stub.async()->WatchVersions(&watch_->context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended: OnDone follows with its status.
    on_event_(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    on_end_(status);
    delete this;
  }

 private:
  // Declared first, so released last: whatever the callbacks hold is gone before the owner
  // waiting for its calls to end may go away.
  const CallTracker::Token call_;
  const std::shared_ptr<VersionWatch> watch_;
  const OnEvent on_event_;
  const OnEnd on_end_;
  weightstore::v1::WatchVersionsRequest request_;
  weightstore::v1::WatchVersionsResponse response_;
};

void VersionWatch::Start(weightstore::v1::WeightStoreService::StubInterface& stub,
                         const std::string& adapter, OnEvent on_event, OnEnd on_end,
                         CallTracker& calls) {
  (new Reactor(shared_from_this(), std::move(on_event), std::move(on_end), calls))
      ->Begin(stub, adapter);
}

}  // namespace tandem::rollout
