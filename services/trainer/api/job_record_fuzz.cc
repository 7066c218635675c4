// Job records are read back from disk at every start, where bytes can rot: any file must decode
// to a clear status (the store then quarantines it), and a record that decodes must encode and
// decode to the same job.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/checksummed_message.h"
#include "common/testing/fuzz_check.h"
#include "google/protobuf/util/message_differencer.h"
#include "tandem/trainer/v1/trainer.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::testing::FuzzCheck;
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  tandem::trainer::v1::Job job;
  if (!tandem::DecodeChecksummed("TJOB", file, job).ok()) return 0;
  const std::string encoded = tandem::EncodeChecksummed("TJOB", job);
  tandem::trainer::v1::Job again;
  FuzzCheck(tandem::DecodeChecksummed("TJOB", encoded, again).ok(), "an encoded job decodes");
  FuzzCheck(google::protobuf::util::MessageDifferencer::Equals(again, job), "round trip");
  return 0;
}
