#ifndef TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SINK_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SINK_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/router_replay/client/route_sink.h"

namespace tandem::router_replay::testing {

// A RouteSink that keeps what it is given: each record's rows and whether it was sealed. Appends
// and acknowledgements can be made to fail, as router-replay's would.
class FakeRouteSink final : public RouteSink {
 public:
  struct Record {
    RouteShape shape;
    std::vector<int16_t> rows;  // [rows, layers, top_k], in the order appended.
    bool sealed = false;
  };

  absl::Status Append(const RecordKey& key, const RouteShape& shape, int64_t first_row,
                      int64_t num_rows, const int16_t* rows, bool seal) override {
    absl::MutexLock lock(&mutex_);
    if (!append_error_.ok()) return append_error_;
    Record& record = records_[EncodeRecordKey(key)];
    const int64_t ids = num_rows * shape.ids_per_row();
    if (first_row * shape.ids_per_row() != static_cast<int64_t>(record.rows.size())) {
      // As router-replay refuses a gap or an overlap that the record does not continue.
      return absl::FailedPreconditionError("rows appended out of order");
    }
    record.shape = shape;
    record.rows.insert(record.rows.end(), rows, rows + ids);
    record.sealed |= seal;
    return absl::OkStatus();
  }

  absl::Status WaitForRecord(const RecordKey& key, absl::Time /*deadline*/) override {
    absl::MutexLock lock(&mutex_);
    if (!records_.contains(EncodeRecordKey(key))) {
      return absl::NotFoundError("no rows were appended to this record");
    }
    return ack_error_;
  }

  // Appends fail with `error` from now on (OK: they succeed again).
  void FailAppends(absl::Status error) {
    absl::MutexLock lock(&mutex_);
    append_error_ = std::move(error);
  }
  // Records are acknowledged with `error` from now on.
  void FailAcknowledgements(absl::Status error) {
    absl::MutexLock lock(&mutex_);
    ack_error_ = std::move(error);
  }

  std::map<std::string, Record> records() const {
    absl::MutexLock lock(&mutex_);
    return records_;
  }

 private:
  mutable absl::Mutex mutex_;
  std::map<std::string, Record> records_ ABSL_GUARDED_BY(mutex_);  // By encoded key.
  absl::Status append_error_ ABSL_GUARDED_BY(mutex_);
  absl::Status ack_error_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tandem::router_replay::testing

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_CLIENT_TESTING_FAKE_ROUTE_SINK_H_
