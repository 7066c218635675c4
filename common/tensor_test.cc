#include "common/tensor.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(DTypeTest, NamesRoundTrip) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI16, DType::kI32}) {
    absl::StatusOr<DType> parsed = DTypeFromName(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kI16), "I16");
}

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI16), 2);
  EXPECT_EQ(DTypeSize(DType::kI32), 4);
}

TEST(DTypeTest, UnknownNameIsInvalidArgument) {
  for (const char* name : {"F64", "f32", "", "BOOL"}) {
    absl::StatusOr<DType> parsed = DTypeFromName(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("'", name, "'")));
  }
}

TEST(BFloat16Test, ExactValuesRoundTrip) {
  for (float value : {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 0x1p100f, kInf, -kInf}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(ToFloat(ToBFloat16(value))), std::bit_cast<uint32_t>(value))
        << value;
  }
  EXPECT_EQ(ToBFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(ToBFloat16(-2.0f).bits, 0xc000);
}

TEST(BFloat16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.0.
  EXPECT_EQ(ToBFloat16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between odd 0x3f81 and even 0x3f82.
  EXPECT_EQ(ToBFloat16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(ToBFloat16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(ToBFloat16(std::bit_cast<float>(0x3f807fffu)).bits, 0x3f80);
  // The largest float rounds up to inf.
  EXPECT_EQ(ToBFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
}

TEST(BFloat16Test, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(ToFloat(ToBFloat16(kNaN))));
  // Payload only in the low 16 bits: plain truncation would give inf.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  ASSERT_TRUE(std::isnan(low_payload_nan));
  EXPECT_TRUE(std::isnan(ToFloat(ToBFloat16(low_payload_nan))));
  EXPECT_TRUE(std::signbit(ToFloat(ToBFloat16(-kNaN))));
}

TEST(BFloat16Test, SubnormalsSurvive) {
  const float smallest = std::numeric_limits<float>::denorm_min() * 65536.0f;
  EXPECT_EQ(ToFloat(ToBFloat16(smallest)), smallest);
}

TEST(Float16Test, KnownEncodings) {
  EXPECT_EQ(ToFloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(ToFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(ToFloat16(1.0f).bits, 0x3c00);
  EXPECT_EQ(ToFloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(ToFloat16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(ToFloat16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
  EXPECT_EQ(ToFloat16(kInf).bits, 0x7c00);
  EXPECT_EQ(ToFloat16(-kInf).bits, 0xfc00);
}

TEST(Float16Test, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const Float16 half{static_cast<uint16_t>(bits)};
    const float value = ToFloat(half);
    if (std::isnan(value)) {
      EXPECT_EQ((bits & 0x7c00), 0x7c00u);
      EXPECT_NE((bits & 0x3ff), 0u);
      EXPECT_TRUE(std::isnan(ToFloat(ToFloat16(value))));
      continue;
    }
    EXPECT_EQ(ToFloat16(value).bits, bits) << value;
  }
}

TEST(Float16Test, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even 1.0.
  EXPECT_EQ(ToFloat16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  // 1 + 3 * 2^-11 is halfway between odd 0x3c01 and even 0x3c02.
  EXPECT_EQ(ToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(ToFloat16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)).bits, 0x3c01);
  // Mantissa carry into the exponent: just under 2 rounds to 2.
  EXPECT_EQ(ToFloat16(std::nextafter(2.0f, 0.0f)).bits, 0x4000);
}

TEST(Float16Test, OverflowBecomesInf) {
  // 65520 is the midpoint between 65504 and 65536 and ties to inf.
  EXPECT_EQ(ToFloat16(65519.996f).bits, 0x7bff);
  EXPECT_EQ(ToFloat16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(ToFloat16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(ToFloat16(std::numeric_limits<float>::max()).bits, 0x7c00);
}

TEST(Float16Test, Subnormals) {
  const float smallest = std::ldexp(1.0f, -24);
  EXPECT_EQ(ToFloat16(smallest).bits, 0x0001);
  EXPECT_EQ(ToFloat(Float16{0x0001}), smallest);
  EXPECT_EQ(ToFloat(Float16{0x83ff}), -1023 * smallest);
  // Exactly half the smallest subnormal ties to even zero; a hair more is 1.
  EXPECT_EQ(ToFloat16(smallest / 2).bits, 0x0000);
  EXPECT_EQ(ToFloat16(std::nextafter(smallest / 2, 1.0f)).bits, 0x0001);
  // 1.5 and 2.5 units tie to 2 units.
  EXPECT_EQ(ToFloat16(1.5f * smallest).bits, 0x0002);
  EXPECT_EQ(ToFloat16(2.5f * smallest).bits, 0x0002);
  // The largest subnormal plus half a unit carries into the smallest normal.
  EXPECT_EQ(ToFloat16(1023.5f * smallest).bits, 0x0400);
  // Float subnormals are far below half precision.
  EXPECT_EQ(ToFloat16(-std::numeric_limits<float>::denorm_min()).bits, 0x8000);
}

TEST(Float16Test, NaNStaysNaN) {
  EXPECT_EQ(ToFloat16(kNaN).bits & 0x7e00, 0x7e00);
  // Payload only in bits that half precision drops.
  EXPECT_TRUE(std::isnan(ToFloat(ToFloat16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(ToFloat(Float16{0x7c01})));
  EXPECT_TRUE(std::isinf(ToFloat(Float16{0x7c00})));
}

TEST(TensorTest, CreateZeroFills) {
  absl::StatusOr<Tensor> tensor = Tensor::Create(DType::kI32, {2, 3});
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->num_elements(), 6);
  EXPECT_EQ(tensor->byte_size(), 24);
  EXPECT_THAT(tensor->shape(), ElementsAre(2, 3));
  absl::StatusOr<absl::Span<const int32_t>> data = tensor->data<int32_t>();
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(*data, ElementsAre(0, 0, 0, 0, 0, 0));
}

TEST(TensorTest, ScalarAndEmptyShapes) {
  absl::StatusOr<Tensor> scalar = Tensor::Create(DType::kF32, {});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->num_elements(), 1);
  absl::StatusOr<Tensor> empty = Tensor::Create(DType::kBF16, {4, 0, 1LL << 62});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(Tensor().num_elements(), 0);
}

TEST(TensorTest, RejectsNegativeDims) {
  absl::StatusOr<Tensor> tensor = Tensor::Create(DType::kF32, {2, -3});
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("negative dimension -3 at index 1 in shape [2,-3]"));
}

TEST(TensorTest, RejectsOverflow) {
  // Elements fit in int64 but bytes do not.
  absl::StatusOr<Tensor> tensor = Tensor::Create(DType::kF32, {1LL << 31, 1LL << 31});
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(), HasSubstr("[2147483648,2147483648]"));
  EXPECT_TRUE(NumElements({1LL << 31, 1LL << 31}).ok());
  EXPECT_FALSE(NumElements({1LL << 32, 1LL << 32}).ok());
}

TEST(TensorTest, FromBytesChecksByteCount) {
  std::vector<std::byte> bytes(12);
  absl::StatusOr<Tensor> tensor = Tensor::FromBytes(DType::kF32, {2, 2}, bytes);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("got 12 bytes but dtype F32 shape [2,2] needs 16"));
}

TEST(TensorTest, FromBytesKeepsLittleEndianValues) {
  std::vector<std::byte> bytes = {std::byte{0x01}, std::byte{0x02}, std::byte{0xff},
                                  std::byte{0xff}};
  absl::StatusOr<Tensor> tensor = Tensor::FromBytes(DType::kI16, {2}, std::move(bytes));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  absl::StatusOr<absl::Span<const int16_t>> data = tensor->data<int16_t>();
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(*data, ElementsAre(0x0201, -1));
}

TEST(TensorTest, TypedAccessChecksDType) {
  absl::StatusOr<Tensor> tensor = Tensor::Create(DType::kBF16, {2, 3});
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_TRUE(tensor->data<BFloat16>().ok());
  absl::StatusOr<absl::Span<const Float16>> wrong = tensor->data<Float16>();
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("requested F16 elements from a BF16[2,3] tensor"));
  EXPECT_FALSE(tensor->mutable_data<int16_t>().ok());
}

TEST(TensorTest, MutableDataWritesThrough) {
  absl::StatusOr<Tensor> tensor = Tensor::Create(DType::kF32, {3});
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  absl::StatusOr<absl::Span<float>> data = tensor->mutable_data<float>();
  ASSERT_TRUE(data.ok()) << data.status();
  (*data)[1] = 2.5f;
  EXPECT_THAT(*tensor->data<float>(), ElementsAre(0.0f, 2.5f, 0.0f));
}

TEST(TensorTest, EqualityIsBitwise) {
  absl::StatusOr<Tensor> a = Tensor::Create(DType::kF32, {2});
  absl::StatusOr<Tensor> b = Tensor::Create(DType::kF32, {2});
  absl::StatusOr<Tensor> reshaped = Tensor::Create(DType::kF32, {1, 2});
  absl::StatusOr<Tensor> retyped = Tensor::Create(DType::kI32, {2});
  ASSERT_TRUE(a.ok() && b.ok() && reshaped.ok() && retyped.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *reshaped);
  EXPECT_NE(*a, *retyped);
  (*a->mutable_data<float>())[0] = kNaN;
  (*b->mutable_data<float>())[0] = kNaN;
  EXPECT_EQ(*a, *b);
  (*b->mutable_data<float>())[1] = -0.0f;
  EXPECT_NE(*a, *b);
}

TEST(ConvertedToF32Test, SixteenBitFloatsWidenExactlyAndIntegersAreRefused) {
  Tensor bf16 = *Tensor::Create(DType::kBF16, {2});
  (*bf16.mutable_data<BFloat16>())[0] = ToBFloat16(1.5f);
  (*bf16.mutable_data<BFloat16>())[1] = ToBFloat16(-2.0f);
  auto widened = ConvertedToF32(bf16);
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_EQ(widened->shape(), std::vector<int64_t>{2});
  EXPECT_EQ((*widened->data<float>())[0], 1.5f);
  EXPECT_EQ((*widened->data<float>())[1], -2.0f);
  Tensor f16 = *Tensor::Create(DType::kF16, {1});
  (*f16.mutable_data<Float16>())[0] = ToFloat16(0.25f);
  EXPECT_EQ((*ConvertedToF32(f16)->data<float>())[0], 0.25f);
  EXPECT_EQ(ConvertedToF32(*Tensor::Create(DType::kI32, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
