#ifndef TANDEM_COMMON_SAFETENSORS_H_
#define TANDEM_COMMON_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace tandem {

// Reader and writer for the safetensors format
// (https://github.com/huggingface/safetensors):
//
//   u64 little-endian N | N bytes of JSON header | data buffer
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)} with offsets relative to the buffer, plus an optional
// "__metadata__" object of string values.
//
// Parsing is as strict as the reference implementation: the tensors must
// cover the buffer exactly, with no overlap and no gap. Errors:
//   DATA_LOSS         the input ends before what its header describes: fewer
//                     than 8 bytes, a header running past the end, or
//                     data_offsets past the end of the buffer. Typically a
//                     truncated download or copy.
//   INVALID_ARGUMENT  anything else malformed, including a header length over
//                     kMaxSafetensorsHeaderBytes, and dtypes other than F32,
//                     BF16, F16, I16, I32.
// File functions name the path in every message, and report a failing system
// call with its errno-derived code (NOT_FOUND, PERMISSION_DENIED, ...).

// The whole content of one file.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  friend bool operator==(const SafetensorsFile&, const SafetensorsFile&) = default;
};

// Guards against allocating for a garbage length prefix.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes);

// Reads the tensors straight into their own buffers, so peak memory is the
// file size rather than twice it.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// Only the "__metadata__" of the file at `path`, reading its header but none of
// its tensors; the header is checked as ReadSafetensors checks it.
absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(const std::string& path);

// The layout the reference writer produces: "__metadata__" first, tensors
// sorted by name and packed in that order, header padded with spaces to a
// multiple of 8 bytes so the buffer starts aligned. INVALID_ARGUMENT for a
// tensor named "__metadata__" or a name, key or value that is not valid UTF-8
// (JSON cannot carry it).
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file);

// Same bytes as SerializeSafetensors, written atomically: a temporary file in
// the target directory is fsynced and renamed over `path`, then the directory
// is fsynced. Readers see the old file or the new one, never a torn one.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

}  // namespace tandem

#endif  // TANDEM_COMMON_SAFETENSORS_H_
