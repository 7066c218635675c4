// Job spec files are written by hand: any text, JSON or YAML, must parse to a JobSpec or to an
// INVALID_ARGUMENT, never a crash or an exception escaping the parser.
//
// Input: 1 byte choosing the syntax (odd: YAML), then the file's text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/testing/fuzz_check.h"
#include "tools/cli/spec_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<tandem::trainer::v1::JobSpec> spec = tandem::cli::ParseJobSpec(text, data[0] & 1);
  tandem::testing::FuzzCheck(
      spec.ok() || spec.status().code() == absl::StatusCode::kInvalidArgument,
      "a bad spec file is INVALID_ARGUMENT");
  return 0;
}
