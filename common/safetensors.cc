#include "common/safetensors.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/errno_status.h"
#include "common/status.h"

namespace tandem {
namespace {

using ::nlohmann::json;
using ::nlohmann::ordered_json;

constexpr absl::string_view kMetadataKey = "__metadata__";
constexpr size_t kPrefixBytes = 8;
constexpr size_t kMaxExcerptBytes = 64;
constexpr size_t kMaxQuotedNameBytes = 128;
// nlohmann quotes the whole token it choked on, e.g. an unterminated string.
constexpr size_t kMaxJsonErrorBytes = 256;

// Where one tensor's bytes sit in the data buffer, as the header declares.
struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

struct Header {
  std::vector<TensorEntry> entries;  // sorted by data offsets
  std::map<std::string, std::string> metadata;
};

// Error messages quote pieces of the header, which may be arbitrarily big.
// Cuts on a UTF-8 character boundary so the message stays valid text.
std::string Shorten(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0u) == 0x80u) {
    --cut;
  }
  return absl::StrCat(text.substr(0, cut), "...");
}

std::string Quote(absl::string_view name) {
  return absl::StrCat("'", Shorten(name, kMaxQuotedNameBytes), "'");
}

std::string TensorPrefix(absl::string_view name) {
  return absl::StrCat("tensor ", Quote(name), ": ");
}

absl::Status TensorError(absl::string_view name, absl::string_view message) {
  return InvalidRequest("BAD_SAFETENSORS", absl::StrCat(TensorPrefix(name), message));
}

std::string Excerpt(const json& value) {
  return Shorten(value.dump(-1, ' ', false, json::error_handler_t::replace), kMaxExcerptBytes);
}

// nlohmann reports the reason for a parse failure only by exception or to a
// SAX handler. This code does not throw, so a failed parse is replayed
// through this handler to recover the message.
class ParseErrorCollector : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception& error) override {
    message_ = error.what();
    return false;
  }

  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

absl::StatusOr<json> ParseJson(absl::string_view text) {
  json value = json::parse(text.begin(), text.end(), nullptr,
                           /*allow_exceptions=*/false);
  if (!value.is_discarded()) return value;
  ParseErrorCollector collector;
  json::sax_parse(text.begin(), text.end(), &collector);
  return InvalidRequest(
      "BAD_SAFETENSORS",
      absl::StrCat("header is not valid JSON: ", Shorten(collector.message(), kMaxJsonErrorBytes)));
}

uint64_t DecodeU64(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < kPrefixBytes; ++i) {
    value |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  }
  return value;
}

std::string EncodeU64(uint64_t value) {
  std::string bytes(kPrefixBytes, '\0');
  for (size_t i = 0; i < kPrefixBytes; ++i) {
    bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return bytes;
}

// `prefix` holds the first (up to) 8 bytes of input; `input_size` is the
// whole input.
absl::StatusOr<uint64_t> ParseHeaderLength(absl::string_view prefix, uint64_t input_size) {
  if (input_size < kPrefixBytes) {
    return absl::DataLossError(absl::StrCat(
        "input is ", input_size, " bytes, shorter than the 8-byte header length prefix"));
  }
  const uint64_t length = DecodeU64(prefix);
  if (length > kMaxSafetensorsHeaderBytes) {
    return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("huge header length ", length, " (limit ",
                                                          kMaxSafetensorsHeaderBytes, " bytes)"));
  }
  if (length > input_size - kPrefixBytes) {
    return absl::DataLossError(absl::StrCat("header length ", length, " exceeds the ",
                                            input_size - kPrefixBytes,
                                            " bytes after the length prefix"));
  }
  return length;
}

absl::StatusOr<const json*> Field(const json& entry, absl::string_view name,
                                  absl::string_view key) {
  const auto it = entry.find(key);
  if (it == entry.end()) {
    return TensorError(name, absl::StrCat("missing \"", key, "\""));
  }
  return &*it;
}

absl::StatusOr<DType> ParseDType(const json& entry, absl::string_view name) {
  absl::StatusOr<const json*> field = Field(entry, name, "dtype");
  if (!field.ok()) return field.status();
  const json& dtype = **field;
  if (!dtype.is_string()) {
    return TensorError(name, absl::StrCat("\"dtype\" is ", Excerpt(dtype), ", expected a string"));
  }
  absl::StatusOr<DType> parsed = DTypeFromName(dtype.get_ref<const std::string&>());
  if (!parsed.ok()) {
    // The rejected name is echoed back and may be huge.
    return TensorError(name, Shorten(parsed.status().message(), 2 * kMaxExcerptBytes));
  }
  return parsed;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const json& entry, absl::string_view name) {
  absl::StatusOr<const json*> field = Field(entry, name, "shape");
  if (!field.ok()) return field.status();
  const json& shape = **field;
  if (!shape.is_array()) {
    return TensorError(name, absl::StrCat("\"shape\" is ", Excerpt(shape), ", expected an array"));
  }
  std::vector<int64_t> dims;
  dims.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& dim = shape[i];
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return TensorError(name, absl::StrCat("negative dimension ", Excerpt(dim), " at index ", i,
                                            " in shape ", Excerpt(shape)));
    }
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
      return TensorError(
          name, absl::StrCat("shape[", i, "] is ", Excerpt(dim), ", expected an int64 >= 0"));
    }
    dims.push_back(dim.get<int64_t>());
  }
  return dims;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> ParseOffsets(const json& entry,
                                                           absl::string_view name) {
  absl::StatusOr<const json*> field = Field(entry, name, "data_offsets");
  if (!field.ok()) return field.status();
  const json& offsets = **field;
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return TensorError(name, absl::StrCat("\"data_offsets\" is ", Excerpt(offsets),
                                          ", expected [begin, end] as non-negative integers"));
  }
  return std::make_pair(offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>());
}

absl::StatusOr<TensorEntry> ParseEntry(const std::string& name, const json& entry,
                                       uint64_t buffer_size) {
  if (!entry.is_object()) {
    return TensorError(name, absl::StrCat("entry is ", Excerpt(entry), ", expected an object"));
  }
  absl::StatusOr<DType> dtype = ParseDType(entry, name);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<std::vector<int64_t>> shape = ParseShape(entry, name);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> offsets = ParseOffsets(entry, name);
  if (!offsets.ok()) return offsets.status();
  const auto [begin, end] = *offsets;
  const std::string range = absl::StrCat("[", begin, ", ", end, ")");
  if (begin > end) {
    return TensorError(name, absl::StrCat("data_offsets ", range, " has begin > end"));
  }
  if (end > buffer_size) {
    return absl::DataLossError(absl::StrCat(TensorPrefix(name), "data_offsets ", range,
                                            " run past the end of the ", buffer_size,
                                            "-byte data buffer"));
  }
  absl::StatusOr<int64_t> needed = ByteSize(*dtype, *shape);
  if (!needed.ok()) return Annotate(needed.status(), TensorPrefix(name));
  if (end - begin != static_cast<uint64_t>(*needed)) {
    return TensorError(name, absl::StrCat("data_offsets ", range, " has ", end - begin,
                                          " bytes but dtype ", DTypeName(*dtype), " shape ",
                                          ShapeToString(*shape), " needs ", *needed));
  }
  return TensorEntry{name, *dtype, *std::move(shape), begin, end};
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const json& metadata) {
  if (!metadata.is_object()) {
    return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("\"__metadata__\" is ", Excerpt(metadata),
                                                          ", expected an object of strings"));
  }
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("metadata ", Quote(key), " is ",
                                                            Excerpt(value), ", expected a string"));
    }
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

std::string RangeOf(const TensorEntry& entry) {
  return absl::StrCat(Quote(entry.name), " [", entry.begin, ", ", entry.end, ")");
}

// The reference implementation accepts only headers whose tensors tile the
// buffer exactly; anything else is a corrupt or hand-crafted file. Sorts
// `entries` by offsets as a side effect.
absl::Status CheckCoverage(std::vector<TensorEntry>& entries, uint64_t buffer_size) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& entry : entries) {
    const uint64_t covered = previous == nullptr ? 0 : previous->end;
    if (entry.begin < covered) {
      return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("tensors ", RangeOf(*previous), " and ",
                                                            RangeOf(entry), " overlap"));
    }
    if (entry.begin > covered) {
      return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("data buffer bytes [", covered, ", ",
                                                            entry.begin, ") belong to no tensor"));
    }
    previous = &entry;
  }
  const uint64_t covered = previous == nullptr ? 0 : previous->end;
  if (covered != buffer_size) {
    return InvalidRequest("BAD_SAFETENSORS", absl::StrCat("data buffer bytes [", covered, ", ",
                                                          buffer_size, ") belong to no tensor"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Header> ParseHeader(absl::string_view text, uint64_t buffer_size) {
  absl::StatusOr<json> root = ParseJson(text);
  if (!root.ok()) return root.status();
  if (!root->is_object()) {
    return InvalidRequest("BAD_SAFETENSORS",
                          absl::StrCat("header is ", Excerpt(*root), ", expected a JSON object"));
  }
  Header header;
  for (const auto& [name, value] : root->items()) {
    if (name == kMetadataKey) {
      absl::StatusOr<std::map<std::string, std::string>> metadata = ParseMetadata(value);
      if (!metadata.ok()) return metadata.status();
      header.metadata = *std::move(metadata);
      continue;
    }
    absl::StatusOr<TensorEntry> entry = ParseEntry(name, value, buffer_size);
    if (!entry.ok()) return entry.status();
    header.entries.push_back(*std::move(entry));
  }
  if (absl::Status status = CheckCoverage(header.entries, buffer_size); !status.ok()) {
    return status;
  }
  return header;
}

// Mirrors what JSON text, and the reference's Rust strings, can hold:
// shortest-form sequences, no surrogates, nothing past U+10FFFF.
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length = 1;
    uint32_t code_point = lead;
    uint32_t min_code_point = 0;
    if (lead >= 0xf0 && lead < 0xf8) {
      length = 4, code_point = lead & 0x07u, min_code_point = 0x10000;
    } else if (lead >= 0xe0 && lead < 0xf0) {
      length = 3, code_point = lead & 0x0fu, min_code_point = 0x800;
    } else if (lead >= 0xc0 && lead < 0xe0) {
      length = 2, code_point = lead & 0x1fu, min_code_point = 0x80;
    } else if (lead >= 0x80) {
      return false;
    }
    if (text.size() - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0u) != 0x80u) return false;
      code_point = (code_point << 6) | (next & 0x3fu);
    }
    if (code_point < min_code_point || code_point > 0x10ffff ||
        (code_point >= 0xd800 && code_point <= 0xdfff)) {
      return false;
    }
    i += length;
  }
  return true;
}

absl::Status CheckUtf8(absl::string_view what, absl::string_view text) {
  if (IsValidUtf8(text)) return absl::OkStatus();
  return InvalidRequest("BAD_SAFETENSORS",
                        absl::StrCat(what, " \"", absl::CHexEscape(text), "\" is not valid UTF-8"));
}

absl::Status CheckSerializable(const SafetensorsFile& file) {
  for (const auto& [name, tensor] : file.tensors) {
    if (name == kMetadataKey) {
      return InvalidRequest("BAD_SAFETENSORS",
                            "a tensor cannot be named \"__metadata__\": the key is reserved");
    }
    if (absl::Status status = CheckUtf8("tensor name", name); !status.ok()) {
      return status;
    }
  }
  for (const auto& [key, value] : file.metadata) {
    if (absl::Status status = CheckUtf8("metadata key", key); !status.ok()) {
      return status;
    }
    if (absl::Status status = CheckUtf8("metadata value", value); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// Length prefix, JSON and padding: everything before the data buffer.
absl::StatusOr<std::string> EncodeHeader(const SafetensorsFile& file) {
  if (absl::Status status = CheckSerializable(file); !status.ok()) {
    return status;
  }
  // ordered_json keeps insertion order, which gives the reference layout.
  ordered_json header = ordered_json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    const uint64_t end = offset + static_cast<uint64_t>(tensor.byte_size());
    ordered_json& entry = header[name];
    entry["dtype"] = DTypeName(tensor.dtype());
    entry["shape"] = tensor.shape();
    entry["data_offsets"] = ordered_json::array({offset, end});
    offset = end;
  }
  std::string text = header.dump();
  text.append((kPrefixBytes - text.size() % kPrefixBytes) % kPrefixBytes, ' ');
  return absl::StrCat(EncodeU64(text.size()), text);
}

absl::string_view AsChars(absl::Span<const std::byte> bytes) {
  return absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Reads exactly bytes.size() bytes at `offset`; DATA_LOSS if the file ends
// first (it shrank after we sized it).
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, absl::Span<std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read", path);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": unexpected end of file at byte ", offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const std::string& path, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("write", path);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(int fd, const std::string& path, uint64_t offset,
                                       uint64_t size) {
  std::string text(size, '\0');
  absl::Status status = ReadAt(
      fd, path, offset, absl::MakeSpan(reinterpret_cast<std::byte*>(text.data()), text.size()));
  if (!status.ok()) return status;
  return text;
}

// A file's parsed header and where its data buffer starts.
struct FileHeader {
  Header header;
  uint64_t data_start = 0;
};

absl::StatusOr<FileHeader> ReadOpenFileHeader(int fd, const std::string& path) {
  struct stat info;
  if (fstat(fd, &info) != 0) return ErrnoStatus("stat", path);
  const auto file_size = static_cast<uint64_t>(info.st_size);
  const std::string context = absl::StrCat(path, ": ");
  absl::StatusOr<std::string> prefix =
      ReadString(fd, path, 0, std::min<uint64_t>(file_size, kPrefixBytes));
  if (!prefix.ok()) return prefix.status();
  absl::StatusOr<uint64_t> length = ParseHeaderLength(*prefix, file_size);
  if (!length.ok()) return Annotate(length.status(), context);
  absl::StatusOr<std::string> text = ReadString(fd, path, kPrefixBytes, *length);
  if (!text.ok()) return text.status();
  const uint64_t data_start = kPrefixBytes + *length;
  absl::StatusOr<Header> header = ParseHeader(*text, file_size - data_start);
  if (!header.ok()) return Annotate(header.status(), context);
  return FileHeader{*std::move(header), data_start};
}

absl::StatusOr<SafetensorsFile> ReadOpenFile(int fd, const std::string& path) {
  absl::StatusOr<FileHeader> read = ReadOpenFileHeader(fd, path);
  if (!read.ok()) return read.status();
  SafetensorsFile file;
  file.metadata = std::move(read->header.metadata);
  for (TensorEntry& entry : read->header.entries) {
    absl::StatusOr<Tensor> tensor = Tensor::Create(entry.dtype, std::move(entry.shape));
    if (!tensor.ok()) return Annotate(tensor.status(), absl::StrCat(path, ": "));
    absl::Status status = ReadAt(fd, path, read->data_start + entry.begin, tensor->mutable_bytes());
    if (!status.ok()) return status;
    file.tensors.emplace(std::move(entry.name), *std::move(tensor));
  }
  return file;
}

absl::Status WriteOpenFile(int fd, const std::string& path, const std::string& header,
                           const SafetensorsFile& file) {
  // mkostemp creates 0600; checkpoints must stay readable by other services.
  if (fchmod(fd, 0644) != 0) return ErrnoStatus("chmod", path);
  if (absl::Status status = WriteAll(fd, path, header); !status.ok()) {
    return status;
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (absl::Status status = WriteAll(fd, path, AsChars(tensor.bytes())); !status.ok()) {
      return status;
    }
  }
  if (fsync(fd) != 0) return ErrnoStatus("fsync", path);
  return absl::OkStatus();
}

// Makes the rename itself durable.
absl::Status SyncDirectoryOf(const std::string& path) {
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open directory", directory);
  const int result = fsync(fd);
  const int fsync_errno = errno;
  close(fd);
  if (result != 0) {
    return absl::ErrnoToStatus(fsync_errno, absl::StrCat("fsync directory ", directory));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes) {
  absl::StatusOr<uint64_t> length = ParseHeaderLength(bytes, bytes.size());
  if (!length.ok()) return length.status();
  const absl::string_view text = bytes.substr(kPrefixBytes, *length);
  const absl::string_view data = bytes.substr(kPrefixBytes + *length);
  absl::StatusOr<Header> header = ParseHeader(text, data.size());
  if (!header.ok()) return header.status();

  SafetensorsFile file;
  file.metadata = std::move(header->metadata);
  for (TensorEntry& entry : header->entries) {
    const absl::string_view slice = data.substr(entry.begin, entry.end - entry.begin);
    absl::StatusOr<Tensor> tensor = Tensor::FromBytes(
        entry.dtype, std::move(entry.shape),
        absl::MakeConstSpan(reinterpret_cast<const std::byte*>(slice.data()), slice.size()));
    if (!tensor.ok()) {
      return Annotate(tensor.status(), TensorPrefix(entry.name));
    }
    file.tensors.emplace(std::move(entry.name), *std::move(tensor));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path);
  absl::StatusOr<SafetensorsFile> file = ReadOpenFile(fd, path);
  close(fd);
  return file;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path);
  absl::StatusOr<FileHeader> read = ReadOpenFileHeader(fd, path);
  close(fd);
  if (!read.ok()) return read.status();
  return std::move(read->header.metadata);
}

absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file) {
  absl::StatusOr<std::string> bytes = EncodeHeader(file);
  if (!bytes.ok()) return bytes.status();
  for (const auto& [name, tensor] : file.tensors) {
    const absl::string_view chars = AsChars(tensor.bytes());
    bytes->append(chars.data(), chars.size());
  }
  return bytes;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  absl::StatusOr<std::string> header = EncodeHeader(file);
  if (!header.ok()) return header.status();
  std::string temp_path = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkostemp(temp_path.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("create temporary file", temp_path);
  absl::Cleanup remove_temp = [&temp_path] { unlink(temp_path.c_str()); };
  absl::Status status = WriteOpenFile(fd, temp_path, *header, file);
  if (close(fd) != 0 && status.ok()) status = ErrnoStatus("close", temp_path);
  if (!status.ok()) return status;
  if (rename(temp_path.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("rename ", temp_path, " to"), path);
  }
  std::move(remove_temp).Cancel();
  return SyncDirectoryOf(path);
}

}  // namespace tandem
