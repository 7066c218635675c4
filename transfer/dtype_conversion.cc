#include "transfer/dtype_conversion.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace tandem::transfer {
namespace {

bool IsFloat(type::v1::Dtype dtype) {
  return dtype == type::v1::DTYPE_F32 || dtype == type::v1::DTYPE_BF16 ||
         dtype == type::v1::DTYPE_F16;
}

size_t FloatSize(type::v1::Dtype dtype) { return dtype == type::v1::DTYPE_F32 ? 4 : 2; }

float LoadFloat(const char* in, type::v1::Dtype dtype) {
  if (dtype == type::v1::DTYPE_F32) {
    float value;
    std::memcpy(&value, in, sizeof(value));
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, in, sizeof(bits));
  return dtype == type::v1::DTYPE_BF16 ? ToFloat(BFloat16{bits}) : ToFloat(Float16{bits});
}

void StoreFloat(float value, type::v1::Dtype dtype, char* out) {
  if (dtype == type::v1::DTYPE_F32) {
    std::memcpy(out, &value, sizeof(value));
    return;
  }
  const uint16_t bits =
      dtype == type::v1::DTYPE_BF16 ? ToBFloat16(value).bits : ToFloat16(value).bits;
  std::memcpy(out, &bits, sizeof(bits));
}

}  // namespace

absl::Status CheckConvertible(type::v1::Dtype from, type::v1::Dtype to) {
  if (to == type::v1::DTYPE_UNSPECIFIED || to == from || (IsFloat(from) && IsFloat(to))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot convert ", type::v1::Dtype_Name(from),
                                                 " to ", type::v1::Dtype_Name(to)));
}

absl::StatusOr<std::string> ConvertFloats(std::string bytes, type::v1::Dtype from,
                                          type::v1::Dtype to) {
  if (to == type::v1::DTYPE_UNSPECIFIED || to == from) return bytes;
  if (absl::Status convertible = CheckConvertible(from, to); !convertible.ok()) {
    return convertible;
  }
  const size_t count = bytes.size() / FloatSize(from);
  std::string out(count * FloatSize(to), '\0');
  for (size_t i = 0; i < count; ++i) {
    StoreFloat(LoadFloat(bytes.data() + i * FloatSize(from), from), to,
               out.data() + i * FloatSize(to));
  }
  return out;
}

}  // namespace tandem::transfer
