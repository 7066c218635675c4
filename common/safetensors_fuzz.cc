// Safetensors files come from users (base models, checkpoints): any bytes must parse to a clear
// status, and what parses must serialize and parse back to the same tensors.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "common/testing/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::testing::FuzzCheck;
  absl::StatusOr<tandem::SafetensorsFile> file =
      tandem::ParseSafetensors(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  absl::StatusOr<std::string> bytes = tandem::SerializeSafetensors(*file);
  FuzzCheck(bytes.ok(), "a parsed file serializes");
  absl::StatusOr<tandem::SafetensorsFile> again = tandem::ParseSafetensors(*bytes);
  FuzzCheck(again.ok() && *again == *file, "serialize then parse gives the same tensors");
  return 0;
}
