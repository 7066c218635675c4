#include "common/tensor.h"

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace tandem {
namespace {

// `initial` lets ByteSize fold the element size into the overflow check.
absl::StatusOr<int64_t> CheckedProduct(absl::Span<const int64_t> shape, int64_t initial) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidRequest("BAD_TENSOR_SHAPE",
                            absl::StrCat("negative dimension ", shape[i], " at index ", i,
                                         " in shape ", ShapeToString(shape)));
    }
  }
  // A zero dim makes any partial overflow irrelevant.
  if (absl::c_linear_search(shape, 0)) return 0;
  int64_t product = initial;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(product, dim, &product)) {
      return InvalidRequest(
          "BAD_TENSOR_SHAPE",
          absl::StrCat("shape ", ShapeToString(shape), " is too large: its size overflows int64"));
    }
  }
  return product;
}

}  // namespace

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  return CheckedProduct(shape, 1);
}

absl::StatusOr<int64_t> ByteSize(DType dtype, absl::Span<const int64_t> shape) {
  return CheckedProduct(shape, DTypeSize(dtype));
}

absl::StatusOr<Tensor> Tensor::Create(DType dtype, std::vector<int64_t> shape) {
  absl::StatusOr<int64_t> size = ByteSize(dtype, shape);
  if (!size.ok()) return size.status();
  std::vector<std::byte> bytes(static_cast<size_t>(*size));
  return Tensor(dtype, std::move(shape), std::move(bytes));
}

absl::StatusOr<Tensor> Tensor::FromBytes(DType dtype, std::vector<int64_t> shape,
                                         absl::Span<const std::byte> bytes) {
  return FromBytes(dtype, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end()));
}

absl::StatusOr<Tensor> Tensor::FromBytes(DType dtype, std::vector<int64_t> shape,
                                         std::vector<std::byte>&& bytes) {
  absl::StatusOr<int64_t> size = ByteSize(dtype, shape);
  if (!size.ok()) return size.status();
  if (static_cast<uint64_t>(*size) != bytes.size()) {
    return InvalidRequest("TENSOR_SIZE_MISMATCH",
                          absl::StrCat("got ", bytes.size(), " bytes but dtype ", DTypeName(dtype),
                                       " shape ", ShapeToString(shape), " needs ", *size));
  }
  return Tensor(dtype, std::move(shape), std::move(bytes));
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_));
}

absl::Status Tensor::CheckElementType(DType requested) const {
  if (requested == dtype_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("requested ", DTypeName(requested),
                                                    " elements from a ", DebugString(), " tensor"));
}

absl::StatusOr<Tensor> ConvertedToF32(const Tensor& tensor) {
  if (tensor.dtype() == DType::kF32) return tensor;
  auto converted = Tensor::Create(DType::kF32, tensor.shape());
  if (!converted.ok()) return converted.status();
  float* out = converted->mutable_data<float>()->data();
  // The spans are bound to locals first: a range-for over `*tensor.data<T>()` would iterate a
  // span inside a StatusOr temporary destroyed before the loop runs.
  if (tensor.dtype() == DType::kBF16) {
    const absl::Span<const BFloat16> values = *tensor.data<BFloat16>();
    for (BFloat16 value : values) *out++ = ToFloat(value);
  } else if (tensor.dtype() == DType::kF16) {
    const absl::Span<const Float16> values = *tensor.data<Float16>();
    for (Float16 value : values) *out++ = ToFloat(value);
  } else {
    return InvalidRequest("UNSUPPORTED_DTYPE", absl::StrCat(DTypeName(tensor.dtype()),
                                                            " is not a floating-point dtype"));
  }
  return converted;
}

}  // namespace tandem
