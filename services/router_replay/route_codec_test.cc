#include "services/router_replay/route_codec.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router_replay/client/testing/route_testing.h"

namespace tandem::router_replay {
namespace {

RouteShape Shape(int layers, int k, int experts) {
  RouteShape shape{.top_k = k, .num_experts = experts};
  for (int l = 0; l < layers; ++l) shape.layers.push_back(3 + 2 * l);  // Dense layers between.
  return shape;
}

std::vector<int16_t> RoundTrip(const RouteShape& shape, const std::vector<int16_t>& rows,
                               int zstd_level) {
  const int64_t n = static_cast<int64_t>(rows.size()) / shape.ids_per_row();
  const std::string block = EncodeBlock(shape, rows.data(), n, zstd_level);
  EXPECT_EQ(*RowsOf(block), n);
  std::vector<int16_t> decoded(rows.size(), 7);
  EXPECT_TRUE(DecodeBlock(shape, block, decoded.data()).ok());
  return decoded;
}

TEST(RouteCodecTest, BitsPerIdIsTheCeilingOfLog2) {
  EXPECT_EQ(BitsPerId(2), 1);
  EXPECT_EQ(BitsPerId(8), 3);
  EXPECT_EQ(BitsPerId(256), 8);  // uint8 territory: one byte per id, no more.
  EXPECT_EQ(BitsPerId(257), 9);  // uint8 would overflow here.
  EXPECT_EQ(BitsPerId(384), 9);
  EXPECT_EQ(BitsPerId(600), 10);
  EXPECT_EQ(BitsPerId(32767), 15);
}

TEST(RouteCodecTest, RoundTripsEveryExpertCountAndEncoding) {
  for (int experts : {8, 256, 384, 600, 32767}) {
    for (int level : {0, 3}) {
      const RouteShape shape = Shape(5, 8, experts);
      const std::vector<int16_t> rows = SyntheticRoutes(shape, 37, experts, 1.2, 5);
      EXPECT_EQ(RoundTrip(shape, rows, level), rows) << experts << " experts, zstd " << level;
    }
  }
}

TEST(RouteCodecTest, HighExpertIdsSurviveWithoutOverflow) {
  const RouteShape shape = Shape(1, 2, 600);
  const std::vector<int16_t> rows = {599, 256, 255, 511, 300, 0};
  EXPECT_EQ(RoundTrip(shape, rows, 0), rows);
}

TEST(RouteCodecTest, StaysWithinOneBytePerIdFor256Experts) {
  const RouteShape shape = Shape(58, 8, 256);
  const int64_t n = 64;
  const std::vector<int16_t> uniform = SyntheticRoutes(shape, n, 1, /*skew=*/0.0);
  const std::string block = EncodeBlock(shape, uniform.data(), n, 0);
  EXPECT_LE(block.size(), n * shape.ids_per_row() + 16);
  // Skewed routing compresses below the packing, each layer with its own hot experts.
  const int64_t long_n = 1024;
  const std::vector<int16_t> skewed = SyntheticRoutes(shape, long_n, 1, /*skew=*/1.2);
  const std::string packed = EncodeBlock(shape, skewed.data(), long_n, 0);
  const std::string compressed = EncodeBlock(shape, skewed.data(), long_n, 1);
  EXPECT_EQ(*EncodingOf(compressed), BlockEncoding::kPackedZstd);
  EXPECT_LT(compressed.size(), packed.size() * 0.9);
}

TEST(RouteCodecTest, MissingRowsCostABitmapOnlyWhenPresent) {
  const RouteShape shape = Shape(4, 2, 16);
  std::vector<int16_t> rows = SyntheticRoutes(shape, 10, 3, 0.5);
  const std::string full = EncodeBlock(shape, rows.data(), 10, 0);
  std::fill_n(rows.begin() + 2 * shape.ids_per_row() + 2, 2, int16_t{-1});  // Row 2, layer 1.
  const std::string with_missing = EncodeBlock(shape, rows.data(), 10, 0);
  EXPECT_EQ(RoundTrip(shape, rows, 0), rows);
  EXPECT_LT(with_missing.size(), full.size() + 6);
}

TEST(RouteCodecTest, ValidateRowsNamesRowLayerAndValue) {
  const RouteShape shape = Shape(2, 2, 8);  // Layers 3 and 5.
  std::vector<int16_t> rows = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(ValidateRows(shape, rows.data(), 2, 0).ok());
  rows[7] = 6;
  absl::Status duplicate = ValidateRows(shape, rows.data(), 2, 40);
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(duplicate.message(), "row 41 layer 5: duplicate expert 6 in slots 0 and 1");
  rows[7] = 8;
  EXPECT_EQ(ValidateRows(shape, rows.data(), 2, 0).message(),
            "row 1 layer 5 slot 1: expert 8 out of range [0, 8)");
  rows[7] = -2;
  EXPECT_EQ(ValidateRows(shape, rows.data(), 2, 0).code(), absl::StatusCode::kInvalidArgument);
  rows[6] = -1;
  rows[7] = 3;
  EXPECT_EQ(ValidateRows(shape, rows.data(), 2, 0).message(),
            "row 1 layer 5: slot 0 is -1 (missing) but slot 1 is expert 3; a (row, layer) is k "
            "distinct ids or all -1");
  rows[7] = -1;
  EXPECT_TRUE(ValidateRows(shape, rows.data(), 2, 0).ok());
}

// Bugs public systems shipped: a capture that never ran leaves all-zero rows, and a load
// balancer's physical slot ids (R > E) leak in place of logical expert ids.
TEST(RouteCodecTest, AllZeroRowsAndPhysicalIdsAreRejected) {
  const RouteShape shape = Shape(2, 8, 256);
  const std::vector<int16_t> zeros(2 * 16, 0);
  EXPECT_EQ(ValidateRows(shape, zeros.data(), 2, 0).message(),
            "row 0 layer 3: duplicate expert 0 in slots 0 and 1");
  std::vector<int16_t> physical = SyntheticRoutes(shape, 2, 1);
  physical[12] = 270;  // A replica slot of a 288-slot placement.
  EXPECT_EQ(ValidateRows(shape, physical.data(), 2, 0).message(),
            "row 0 layer 5 slot 4: expert 270 out of range [0, 256)");
}

TEST(RouteCodecTest, ValidateShapeRejectsBadHeaders) {
  EXPECT_TRUE(ValidateShape(Shape(3, 8, 256)).ok());
  EXPECT_FALSE(ValidateShape(Shape(0, 8, 256)).ok());
  EXPECT_FALSE(ValidateShape(Shape(3, 0, 256)).ok());
  EXPECT_FALSE(ValidateShape(Shape(3, 65, 256)).ok());
  EXPECT_FALSE(ValidateShape(Shape(3, 8, 7)).ok());
  EXPECT_FALSE(ValidateShape(Shape(3, 8, 32768)).ok());
  RouteShape unordered = Shape(3, 2, 8);
  unordered.layers = {1, 5, 5};
  EXPECT_EQ(ValidateShape(unordered).code(), absl::StatusCode::kInvalidArgument);
  unordered.layers = {-1, 5};
  EXPECT_FALSE(ValidateShape(unordered).ok());
}

TEST(RouteCodecTest, CorruptBlocksAreDataLoss) {
  const RouteShape shape = Shape(2, 2, 8);
  const std::vector<int16_t> rows = SyntheticRoutes(shape, 20, 9, 0.0);
  std::vector<int16_t> out(rows.size());
  const std::string block = EncodeBlock(shape, rows.data(), 20, 0);
  EXPECT_EQ(DecodeBlock(shape, block.substr(0, 3), out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeBlock(shape, block.substr(0, block.size() - 4), out.data()).code(),
            absl::StatusCode::kDataLoss);
  // One byte per id (129..256 experts): a byte naming no expert.
  const RouteShape bytes_shape = Shape(2, 2, 200);
  const std::vector<int16_t> byte_rows = SyntheticRoutes(bytes_shape, 20, 9, 0.0);
  std::string byte_block = EncodeBlock(bytes_shape, byte_rows.data(), 20, 0);
  byte_block.back() = static_cast<char>(250);
  std::vector<int16_t> byte_out(byte_rows.size());
  EXPECT_EQ(DecodeBlock(bytes_shape, byte_block, byte_out.data()).code(),
            absl::StatusCode::kDataLoss);
  std::string bad_encoding = block;
  bad_encoding[0] = 9;
  EXPECT_EQ(DecodeBlock(shape, bad_encoding, out.data()).code(), absl::StatusCode::kDataLoss);
  const RouteShape wide = Shape(4, 4, 256);
  const std::vector<int16_t> skewed = SyntheticRoutes(wide, 2000, 9, 1.5);
  std::string zstd_block = EncodeBlock(wide, skewed.data(), 2000, 3);
  ASSERT_EQ(*EncodingOf(zstd_block), BlockEncoding::kPackedZstd);
  zstd_block.resize(zstd_block.size() / 2);
  out.resize(skewed.size());
  EXPECT_EQ(DecodeBlock(wide, zstd_block, out.data()).code(), absl::StatusCode::kDataLoss);
}

// A header whose row count shrank must not let the zstd frame decompress more than those rows
// can hold: the frame's own size field is outside data and could ask for gigabytes.
TEST(RouteCodecTest, ZstdFrameLargerThanTheHeaderAllowsIsDataLoss) {
  const RouteShape wide = Shape(4, 4, 256);
  const std::vector<int16_t> skewed = SyntheticRoutes(wide, 2000, 9, 1.5);
  std::string block = EncodeBlock(wide, skewed.data(), 2000, 3);
  ASSERT_EQ(*EncodingOf(block), BlockEncoding::kPackedZstd);
  block[2] = 1;  // Rows, little-endian u32 at offset 2: now 1.
  block[3] = block[4] = block[5] = 0;
  std::vector<int16_t> out(wide.ids_per_row());
  const absl::Status status = DecodeBlock(wide, block, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("header allows"));
}

}  // namespace
}  // namespace tandem::router_replay
