#include "common/dtype.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  int64_t size;
};

constexpr std::array<DTypeInfo, 5> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kBF16, "BF16", 2},
    {DType::kF16, "F16", 2},
    {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},
}};

constexpr bool TableIsIndexedByDType() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(TableIsIndexedByDType(), "kDTypes must follow enum order");

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

int64_t DTypeSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return InvalidRequest(
      "UNSUPPORTED_DTYPE",
      absl::StrCat("unknown dtype '", name, "' (supported: F32, BF16, F16, I16, I32)"));
}

}  // namespace tandem
