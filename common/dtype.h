#ifndef TANDEM_COMMON_DTYPE_H_
#define TANDEM_COMMON_DTYPE_H_

#include <bit>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Element types that can cross service boundaries. The set is deliberately
// smaller than what safetensors allows: these are the types the engine and
// the trainer actually exchange.
enum class DType { kF32, kBF16, kF16, kI16, kI32 };

// The functions below expect one of the enumerators above; values from the
// wire must come through DTypeFromName.

// Size in bytes of one element.
int64_t DTypeSize(DType dtype);

// Safetensors spelling: "F32", "BF16", "F16", "I16", "I32".
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; INVALID_ARGUMENT for any other string (names are
// case-sensitive, as in safetensors).
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

// Storage types for the 16-bit floats. They are distinct types (rather than
// uint16_t) so that Tensor::data<T>() can tell BF16, F16 and I16 apart.
struct BFloat16 {
  uint16_t bits = 0;
  friend bool operator==(BFloat16, BFloat16) = default;
};

struct Float16 {
  uint16_t bits = 0;
  friend bool operator==(Float16, Float16) = default;
};

// Round-to-nearest-even. NaNs stay NaN: the quiet bit is forced because
// truncating the payload could otherwise leave an all-zero mantissa (= inf).
constexpr BFloat16 ToBFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return {static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>((bits + rounding_bias) >> 16)};
}

constexpr float ToFloat(BFloat16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

namespace dtype_internal {

// Magnitude (sign already removed) of a float below the smallest normal half,
// as a half subnormal: value / 2^-24 rounded to nearest even.
constexpr uint16_t HalfSubnormalBits(uint32_t abs_bits) {
  const int exponent = static_cast<int>(abs_bits >> 23);
  const int shift = 126 - exponent;  // value = mantissa * 2^-shift * 2^-24
  if (shift > 24) return 0;          // below half the smallest subnormal
  const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  // A carry into bit 10 correctly yields the smallest normal half.
  return static_cast<uint16_t>(result);
}

}  // namespace dtype_internal

// IEEE 754 binary16, round-to-nearest-even, with subnormals; values that
// round past 65504 become inf. NaNs stay NaN (quiet bit forced, as above).
constexpr Float16 ToFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {
    return {static_cast<uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu))};
  }
  // 65520 is halfway between 65504 (odd mantissa) and 2^16: ties go to inf.
  if (abs_bits >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};
  if (abs_bits < 0x38800000u) {  // below 2^-14, the smallest normal half
    return {static_cast<uint16_t>(sign | dtype_internal::HalfSubnormalBits(abs_bits))};
  }
  const uint32_t rounding_bias = 0xfffu + ((abs_bits >> 13) & 1u);
  const uint32_t rebiased = abs_bits + rounding_bias - ((127u - 15u) << 23);
  return {static_cast<uint16_t>(sign | (rebiased >> 13))};
}

constexpr float ToFloat(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: exactly mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_DTYPE_H_
