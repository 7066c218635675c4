// A JobSpec is what any client sends CreateJob: whatever its bytes, ResolveJobSpec must answer
// with a status, and a spec it accepts is what Job.spec stores and resumes from, so resolving it
// again must accept it unchanged.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "common/testing/fuzz_check.h"
#include "google/protobuf/util/message_differencer.h"
#include "services/trainer/api/job_spec.h"
#include "tandem/trainer/v1/trainer.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::testing::FuzzCheck;
  tandem::trainer::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<tandem::trainer::v1::JobSpec> resolved =
      tandem::trainer::ResolveJobSpec(spec, "job-1", "/var/lib/tandem/jobs");
  if (!resolved.ok()) return 0;
  absl::StatusOr<tandem::trainer::v1::JobSpec> again =
      tandem::trainer::ResolveJobSpec(*resolved, "job-1", "/var/lib/tandem/jobs");
  FuzzCheck(again.ok(), "a resolved spec resolves");
  FuzzCheck(google::protobuf::util::MessageDifferencer::Equals(*again, *resolved),
            "resolving is idempotent");
  return 0;
}
