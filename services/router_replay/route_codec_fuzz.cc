// Route blocks are read back from disk, where bytes can rot: decoding any block, or any damaged
// copy of a valid one, must give DATA_LOSS or ids within the shape, and never read or allocate
// past what the block's header promises. Valid rows must survive encode then decode exactly.
//
// Input: 4 bytes of shape and mode, then either rows to encode (int16, little-endian) followed by
// damage, or (raw mode) the block itself.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/testing/fuzz_check.h"
#include "services/router_replay/client/route_wire.h"
#include "services/router_replay/route_codec.h"

namespace tandem::router_replay {
namespace {

using ::tandem::testing::FuzzCheck;

// Callers size the output from RowsOf; they bound it by the record's own row count first.
constexpr int64_t kMaxRowsTheCallerAllows = 4096;

struct FuzzInput {
  RouteShape shape;
  int zstd_level = 0;
  bool raw_block = false;
  int damage_count = 0;
  absl::string_view rest;
};

FuzzInput Split(const uint8_t* data, size_t size) {
  FuzzInput input;
  input.shape.layers.resize(1 + data[0] % 6);
  std::iota(input.shape.layers.begin(), input.shape.layers.end(), data[0] / 6 % 4);
  input.shape.top_k = 1 + data[1] % 4;
  input.shape.num_experts = input.shape.top_k + data[2] + (data[3] & 0x80 ? 256 : 0);
  input.zstd_level = data[3] & 1 ? 3 : 0;
  input.raw_block = data[3] & 2;
  input.damage_count = (data[3] >> 2) % 8;
  input.rest = absl::string_view(reinterpret_cast<const char*>(data) + 4, size - 4);
  return input;
}

// Decodes what the header promises into a buffer of exactly that size.
absl::StatusOr<std::vector<int16_t>> DecodeAll(const RouteShape& shape, absl::string_view block) {
  absl::StatusOr<int64_t> rows = RowsOf(block);
  if (!rows.ok()) return rows.status();
  if (*rows > kMaxRowsTheCallerAllows) return absl::DataLossError("more rows than the record");
  std::vector<int16_t> out(*rows * shape.ids_per_row());
  if (absl::Status status = DecodeBlock(shape, block, out.data()); !status.ok()) return status;
  for (int16_t id : out) FuzzCheck(id >= -1 && id < shape.num_experts, "decoded ids in range");
  return out;
}

void CheckRoundTrip(const FuzzInput& input) {
  const int64_t row_bytes = input.shape.ids_per_row() * 2;
  absl::string_view row_data = input.rest.substr(0, input.rest.size() / row_bytes * row_bytes);
  if (row_data.empty()) return;
  std::vector<int16_t> rows(row_data.size() / 2);
  std::memcpy(rows.data(), row_data.data(), row_data.size());
  const int64_t num_rows = static_cast<int64_t>(rows.size()) / input.shape.ids_per_row();
  if (num_rows == 0 || num_rows > kMaxRowsTheCallerAllows) return;
  if (!ValidateRows(input.shape, rows.data(), num_rows, 0).ok()) return;
  std::string block = EncodeBlock(input.shape, rows.data(), num_rows, input.zstd_level);
  absl::StatusOr<std::vector<int16_t>> decoded = DecodeAll(input.shape, block);
  FuzzCheck(decoded.ok() && *decoded == rows, "valid rows survive encode then decode");

  // Damage: (position, xor) byte pairs after the rows.
  absl::string_view damage = input.rest.substr(row_data.size());
  for (int d = 0; d < input.damage_count && damage.size() >= 2 && !block.empty(); ++d) {
    block[static_cast<uint8_t>(damage[0]) % block.size()] ^= damage[1];
    damage.remove_prefix(2);
  }
  (void)DecodeAll(input.shape, block);
}

}  // namespace
}  // namespace tandem::router_replay

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::router_replay;
  if (size < 4) return 0;
  const FuzzInput input = Split(data, size);
  tandem::testing::FuzzCheck(ValidateShape(input.shape).ok(), "the fuzzer builds valid shapes");
  if (input.raw_block) {
    (void)DecodeAll(input.shape, input.rest);
  } else {
    CheckRoundTrip(input);
  }
  return 0;
}
