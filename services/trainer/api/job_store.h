#ifndef TANDEM_SERVICES_TRAINER_JOB_STORE_H_
#define TANDEM_SERVICES_TRAINER_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/trainer/v1/trainer.pb.h"

namespace tandem::trainer {

// Jobs on disk, one file per job (<dir>/jobs/<id>.binpb), each replaced atomically (temporary
// file, fsync, rename, directory fsync), so an acknowledged change survives a crash. A file is
// "TJOB" + the XXH3-64 of the serialized job (8 bytes, little-endian) + the job.
class JobStore {
 public:
  // Creates the directory if needed and reads every job in it. A file that is corrupt (bad
  // checksum, unparsable) is moved aside to <file>.corrupt, logged, and loaded as a FAILED job
  // of that id whose error_message says so: a damaged record never stops the trainer.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& dir);

  const std::vector<trainer::v1::Job>& loaded() const { return loaded_; }
  // Errors name the path; a full disk is RESOURCE_EXHAUSTED.
  absl::Status Put(const trainer::v1::Job& job);

 private:
  explicit JobStore(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  std::vector<trainer::v1::Job> loaded_;
};

}  // namespace tandem::trainer

#endif  // TANDEM_SERVICES_TRAINER_JOB_STORE_H_
