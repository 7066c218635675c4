#ifndef TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_CODEC_H_
#define TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/router_replay/client/route_wire.h"

namespace tandem::router_replay {

// Checks rows [num_rows, layers, top_k]: every id in [-1, num_experts), and each (row, layer)
// either k distinct ids or all -1. Messages name the row (counted from first_row), the global
// layer index and the slot, e.g. "row 17 layer 5: duplicate expert 3"; the error's details name
// the AppendRequest field "rows".
absl::Status ValidateRows(const RouteShape& shape, const int16_t* rows, int64_t num_rows,
                          int64_t first_row);

// How a stored block is encoded.
enum class BlockEncoding : uint8_t {
  // Ids bit-packed at bit_width(num_experts - 1) bits, layer-major, plus a presence bitmap
  // when some (row, layer) is missing.
  kPacked = 1,
  // kPacked, then zstd: chosen only when it is smaller (skewed routing compresses).
  kPackedZstd = 2,
};

// Bits per stored id: ceil(log2(num_experts)), at least 1. 8 for 256 experts, 9 for 384.
int BitsPerId(int32_t num_experts);

// Encodes validated rows; zstd_level <= 0 disables the zstd attempt.
std::string EncodeBlock(const RouteShape& shape, const int16_t* rows, int64_t num_rows,
                        int zstd_level);

// The encoding and row count of a block, DATA_LOSS when its header is corrupt.
absl::StatusOr<BlockEncoding> EncodingOf(absl::string_view block);
absl::StatusOr<int64_t> RowsOf(absl::string_view block);

// Decodes a block into out [rows, layers, top_k]; DATA_LOSS when it is corrupt.
absl::Status DecodeBlock(const RouteShape& shape, absl::string_view block, int16_t* out);

}  // namespace tandem::router_replay

#endif  // TANDEM_SERVICES_ROUTER_REPLAY_ROUTE_CODEC_H_
