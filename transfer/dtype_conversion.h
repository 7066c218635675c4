#ifndef TANDEM_TRANSFER_DTYPE_CONVERSION_H_
#define TANDEM_TRANSFER_DTYPE_CONVERSION_H_

#include <string>

#include "absl/status/statusor.h"
#include "tandem/type/v1/common.pb.h"

namespace tandem::transfer {

// Converts floating-point tensor bytes between F32, BF16 and F16 (round to nearest even);
// UNSPECIFIED or equal dtypes return the bytes unchanged. INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> ConvertFloats(std::string bytes, type::v1::Dtype from,
                                          type::v1::Dtype to);

// OK when ConvertFloats can convert `from` to `to`; its INVALID_ARGUMENT otherwise.
absl::Status CheckConvertible(type::v1::Dtype from, type::v1::Dtype to);

}  // namespace tandem::transfer

#endif  // TANDEM_TRANSFER_DTYPE_CONVERSION_H_
