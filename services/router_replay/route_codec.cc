#include "services/router_replay/route_codec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "zstd.h"

namespace tandem::router_replay {
namespace {

// Block header: encoding (1 byte), flags (1 byte), rows (uint32 little-endian).
constexpr size_t kHeaderBytes = 6;
constexpr uint8_t kHasMissingBitmap = 1;

absl::Status CheckRow(const RouteShape& shape, const int16_t* ids, int64_t row, int layer) {
  const int k = shape.top_k;
  const auto where = [&] { return absl::StrCat("row ", row, " layer ", shape.layers[layer]); };
  if (ids[0] == -1) {
    for (int s = 1; s < k; ++s) {
      if (ids[s] != -1) {
        return InvalidField(
            "rows", absl::StrCat(where(), ": slot 0 is -1 (missing) but slot ", s, " is expert ",
                                 ids[s], "; a (row, layer) is k distinct ids or all -1"));
      }
    }
    return absl::OkStatus();
  }
  for (int s = 0; s < k; ++s) {
    if (ids[s] < 0 || ids[s] >= shape.num_experts) {
      return InvalidField("rows", absl::StrCat(where(), " slot ", s, ": expert ", ids[s],
                                               " out of range [0, ", shape.num_experts, ")"));
    }
    for (int earlier = 0; earlier < s; ++earlier) {
      if (ids[earlier] == ids[s]) {
        return InvalidField("rows", absl::StrCat(where(), ": duplicate expert ", ids[s],
                                                 " in slots ", earlier, " and ", s));
      }
    }
  }
  return absl::OkStatus();
}

// LSB-first bit stream; values are at most 15 bits.
class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  void Write(uint32_t value, int bits) {
    accumulator_ |= static_cast<uint64_t>(value) << filled_;
    filled_ += bits;
    while (filled_ >= 8) {
      out_.push_back(static_cast<char>(accumulator_ & 0xff));
      accumulator_ >>= 8;
      filled_ -= 8;
    }
  }
  void Flush() {
    if (filled_ > 0) out_.push_back(static_cast<char>(accumulator_ & 0xff));
    accumulator_ = 0;
    filled_ = 0;
  }

 private:
  std::string& out_;
  uint64_t accumulator_ = 0;
  int filled_ = 0;
};

class BitReader {
 public:
  explicit BitReader(absl::string_view in) : in_(in) {}
  // False when the stream ends early.
  bool Read(int bits, uint32_t& value) {
    while (filled_ < bits) {
      if (position_ >= in_.size()) return false;
      accumulator_ |= static_cast<uint64_t>(static_cast<uint8_t>(in_[position_++])) << filled_;
      filled_ += 8;
    }
    value = static_cast<uint32_t>(accumulator_ & ((uint64_t{1} << bits) - 1));
    accumulator_ >>= bits;
    filled_ -= bits;
    return true;
  }
  size_t bytes_consumed() const { return position_; }

 private:
  absl::string_view in_;
  size_t position_ = 0;
  uint64_t accumulator_ = 0;
  int filled_ = 0;
};

// Presence bitmap (bit r*L + l set when (row r, layer l) has ids), or empty when none is missing.
std::string PresenceBitmap(const RouteShape& shape, const int16_t* rows, int64_t num_rows) {
  const int64_t cells = num_rows * static_cast<int64_t>(shape.layers.size());
  bool any_missing = false;
  for (int64_t c = 0; c < cells && !any_missing; ++c) any_missing = rows[c * shape.top_k] == -1;
  if (!any_missing) return "";
  std::string bitmap((cells + 7) / 8, '\0');
  for (int64_t c = 0; c < cells; ++c) {
    if (rows[c * shape.top_k] != -1) bitmap[c / 8] |= static_cast<char>(1 << (c % 8));
  }
  return bitmap;
}

bool Present(absl::string_view bitmap, int64_t cell) {
  return bitmap.empty() || (static_cast<uint8_t>(bitmap[cell / 8]) >> (cell % 8)) & 1;
}

// The packed payload: [bitmap] then ids layer by layer, so one layer's skew sits together
// where zstd can find it.
std::string PackPayload(const RouteShape& shape, const int16_t* rows, int64_t num_rows,
                        const std::string& bitmap) {
  const int layers = static_cast<int>(shape.layers.size());
  const int k = shape.top_k;
  const int bits = BitsPerId(shape.num_experts);
  std::string payload = bitmap;
  if (bits == 8 && bitmap.empty()) {  // One byte per id: skip the bit writer.
    payload.resize(num_rows * shape.ids_per_row());
    char* out = payload.data();
    for (int l = 0; l < layers; ++l) {
      for (int64_t r = 0; r < num_rows; ++r) {
        const int16_t* ids = rows + (r * layers + l) * k;
        for (int s = 0; s < k; ++s) *out++ = static_cast<char>(ids[s]);
      }
    }
    return payload;
  }
  payload.reserve(bitmap.size() + (num_rows * shape.ids_per_row() * bits + 7) / 8);
  BitWriter writer(payload);
  for (int l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t cell = r * layers + l;
      if (!Present(bitmap, cell)) continue;
      const int16_t* ids = rows + cell * k;
      for (int s = 0; s < k; ++s) writer.Write(static_cast<uint16_t>(ids[s]), bits);
    }
  }
  writer.Flush();
  return payload;
}

std::string Header(BlockEncoding encoding, bool has_bitmap, int64_t num_rows) {
  std::string header(kHeaderBytes, '\0');
  header[0] = static_cast<char>(encoding);
  header[1] = static_cast<char>(has_bitmap ? kHasMissingBitmap : 0);
  absl::little_endian::Store32(header.data() + 2, static_cast<uint32_t>(num_rows));
  return header;
}

ZSTD_CCtx* ThreadCompressionContext() {
  thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> context(ZSTD_createCCtx(),
                                                                            &ZSTD_freeCCtx);
  return context.get();
}

ZSTD_DCtx* ThreadDecompressionContext() {
  thread_local std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> context(ZSTD_createDCtx(),
                                                                            &ZSTD_freeDCtx);
  return context.get();
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt route block: ", what));
}

// The one-byte-per-id payload of a block without missing cells.
absl::Status UnpackBytes(const RouteShape& shape, absl::string_view payload, int64_t num_rows,
                         int16_t* out) {
  const int layers = static_cast<int>(shape.layers.size());
  const int k = shape.top_k;
  if (static_cast<int64_t>(payload.size()) != num_rows * shape.ids_per_row()) {
    return Corrupt("ids truncated");
  }
  const auto* in = reinterpret_cast<const uint8_t*>(payload.data());
  uint8_t largest = 0;
  for (int l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < num_rows; ++r) {
      int16_t* ids = out + (r * layers + l) * k;
      for (int s = 0; s < k; ++s, ++in) {
        largest = std::max(largest, *in);
        ids[s] = *in;
      }
    }
  }
  if (largest >= shape.num_experts)
    return Corrupt(absl::StrCat("expert ", largest, " out of range"));
  return absl::OkStatus();
}

// `max_size` is the most the block's header allows, so a damaged frame header cannot make the
// reader allocate gigabytes.
absl::StatusOr<std::string> Decompress(absl::string_view compressed, uint64_t max_size) {
  const unsigned long long size = ZSTD_getFrameContentSize(compressed.data(), compressed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Corrupt("bad zstd frame");
  }
  if (size > max_size) {
    return Corrupt(absl::StrCat("zstd frame of ", size, " bytes, header allows ", max_size));
  }
  std::string payload(size, '\0');
  const size_t written = ZSTD_decompressDCtx(ThreadDecompressionContext(), payload.data(), size,
                                             compressed.data(), compressed.size());
  if (ZSTD_isError(written) || written != size) return Corrupt("zstd decompression failed");
  return payload;
}

}  // namespace

absl::Status ValidateRows(const RouteShape& shape, const int16_t* rows, int64_t num_rows,
                          int64_t first_row) {
  const int layers = static_cast<int>(shape.layers.size());
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int l = 0; l < layers; ++l) {
      const int16_t* ids = rows + (r * layers + l) * shape.top_k;
      if (absl::Status status = CheckRow(shape, ids, first_row + r, l); !status.ok()) {
        return status;
      }
    }
  }
  return absl::OkStatus();
}

int BitsPerId(int32_t num_experts) {
  return std::max(1, static_cast<int>(std::bit_width(static_cast<uint32_t>(num_experts - 1))));
}

namespace {

// zstd over the payload, ending a zstd block after the bitmap and after each layer: every block
// gets its own literal (Huffman) table, and each layer has its own hot experts. Empty when
// compression fails.
std::string CompressPerLayer(absl::string_view payload, size_t bitmap_bytes, size_t layer_bytes,
                             int layers, int zstd_level) {
  ZSTD_CCtx* context = ThreadCompressionContext();
  ZSTD_CCtx_reset(context, ZSTD_reset_session_only);
  ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, zstd_level);
  ZSTD_CCtx_setPledgedSrcSize(context, payload.size());
  std::string out(ZSTD_compressBound(payload.size()) + 64 * static_cast<size_t>(layers + 2), '\0');
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  size_t offset = 0;
  const auto feed = [&](size_t bytes, ZSTD_EndDirective directive) {
    ZSTD_inBuffer input{payload.data() + offset, bytes, 0};
    size_t remaining = 0;
    do {
      remaining = ZSTD_compressStream2(context, &output, &input, directive);
      if (ZSTD_isError(remaining)) return false;
    } while (remaining != 0 || input.pos < input.size);
    offset += bytes;
    return true;
  };
  bool ok = bitmap_bytes == 0 || feed(bitmap_bytes, ZSTD_e_flush);
  for (int l = 0; ok && l < layers - 1; ++l) ok = feed(layer_bytes, ZSTD_e_flush);
  ok = ok && feed(payload.size() - offset, ZSTD_e_end);
  if (!ok) return "";
  out.resize(output.pos);
  return out;
}

}  // namespace

std::string EncodeBlock(const RouteShape& shape, const int16_t* rows, int64_t num_rows,
                        int zstd_level) {
  const std::string bitmap = PresenceBitmap(shape, rows, num_rows);
  const std::string payload = PackPayload(shape, rows, num_rows, bitmap);
  const bool has_bitmap = !bitmap.empty();
  const int layers = static_cast<int>(shape.layers.size());
  // Layer boundaries fall on bytes only without missing cells and with whole-byte layers.
  const int64_t layer_bits = num_rows * shape.top_k * BitsPerId(shape.num_experts);
  const bool per_layer = !has_bitmap && layer_bits % 8 == 0;
  if (zstd_level > 0) {
    const std::string compressed = CompressPerLayer(
        payload, bitmap.size(), per_layer ? layer_bits / 8 : 0, per_layer ? layers : 1, zstd_level);
    if (!compressed.empty() && compressed.size() < payload.size()) {
      return Header(BlockEncoding::kPackedZstd, has_bitmap, num_rows) + compressed;
    }
  }
  return Header(BlockEncoding::kPacked, has_bitmap, num_rows) + payload;
}

absl::StatusOr<BlockEncoding> EncodingOf(absl::string_view block) {
  if (block.size() < kHeaderBytes) return Corrupt("shorter than its header");
  const auto encoding = static_cast<BlockEncoding>(block[0]);
  if (encoding != BlockEncoding::kPacked && encoding != BlockEncoding::kPackedZstd) {
    return Corrupt(absl::StrCat("unknown encoding ", static_cast<int>(block[0])));
  }
  return encoding;
}

absl::StatusOr<int64_t> RowsOf(absl::string_view block) {
  if (block.size() < kHeaderBytes) return Corrupt("shorter than its header");
  return static_cast<int64_t>(absl::little_endian::Load32(block.data() + 2));
}

absl::Status DecodeBlock(const RouteShape& shape, absl::string_view block, int16_t* out) {
  absl::StatusOr<BlockEncoding> encoding = EncodingOf(block);
  if (!encoding.ok()) return encoding.status();
  const int64_t num_rows = *RowsOf(block);
  const bool has_bitmap = block[1] & kHasMissingBitmap;
  const int layers = static_cast<int>(shape.layers.size());
  const int k = shape.top_k;
  const int bits = BitsPerId(shape.num_experts);
  const int64_t cells = num_rows * layers;
  const size_t bitmap_bytes = has_bitmap ? (cells + 7) / 8 : 0;
  std::string decompressed;
  absl::string_view payload = block.substr(kHeaderBytes);
  if (*encoding == BlockEncoding::kPackedZstd) {
    const uint64_t max_payload = bitmap_bytes + (cells * k * bits + 7) / 8;
    absl::StatusOr<std::string> inflated = Decompress(payload, max_payload);
    if (!inflated.ok()) return inflated.status();
    decompressed = *std::move(inflated);
    payload = decompressed;
  }
  if (payload.size() < bitmap_bytes) return Corrupt("presence bitmap truncated");
  const absl::string_view bitmap = payload.substr(0, bitmap_bytes);
  if (bits == 8 && bitmap_bytes == 0) return UnpackBytes(shape, payload, num_rows, out);
  BitReader reader(payload.substr(bitmap_bytes));
  for (int l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t cell = r * layers + l;
      int16_t* ids = out + cell * k;
      if (!Present(bitmap, cell)) {
        std::fill_n(ids, k, int16_t{-1});
        continue;
      }
      for (int s = 0; s < k; ++s) {
        uint32_t value = 0;
        if (!reader.Read(bits, value)) return Corrupt("ids truncated");
        if (value >= static_cast<uint32_t>(shape.num_experts)) {
          return Corrupt(absl::StrCat("expert ", value, " out of range"));
        }
        ids[s] = static_cast<int16_t>(value);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::router_replay
