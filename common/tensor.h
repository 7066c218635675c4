#ifndef TANDEM_COMMON_TENSOR_H_
#define TANDEM_COMMON_TENSOR_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace tandem {

// Tensor bytes are little-endian on the wire and in files; the typed accessors
// reinterpret them in place, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "Tandem assumes a little-endian host");

// The C++ types that store tensor elements, one per DType.
template <typename T>
concept TensorElement = std::is_same_v<T, float> || std::is_same_v<T, BFloat16> ||
    std::is_same_v<T, Float16> || std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t>;

template <TensorElement T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, BFloat16>) return DType::kBF16;
  if constexpr (std::is_same_v<T, Float16>) return DType::kF16;
  if constexpr (std::is_same_v<T, int16_t>) return DType::kI16;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
}

// "[2,3]"; "[]" for a scalar.
std::string ShapeToString(absl::Span<const int64_t> shape);

// Product of the dims (1 for a scalar). INVALID_ARGUMENT for a negative dim
// or when the product overflows int64.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);

// NumElements times the element size, with the same checks.
absl::StatusOr<int64_t> ByteSize(DType dtype, absl::Span<const int64_t> shape);

// A dense, row-major tensor that owns its little-endian bytes: the exchange
// type between safetensors files, the weight-store and the engine.
//
// Invariant: bytes().size() == ByteSize(dtype(), shape()). Every constructor
// path checks it, so accessors never need to.
class Tensor {
 public:
  // An empty F32 tensor of shape [0], so Tensor can live in containers.
  Tensor() : shape_{0} {}

  // Zero-filled. Sizes come from the caller, so anyone passing a shape taken
  // from the network should bound it first: this allocates it all.
  static absl::StatusOr<Tensor> Create(DType dtype, std::vector<int64_t> shape);

  // INVALID_ARGUMENT unless bytes.size() matches dtype and shape. The rvalue
  // overload adopts the buffer instead of copying it.
  static absl::StatusOr<Tensor> FromBytes(DType dtype, std::vector<int64_t> shape,
                                          absl::Span<const std::byte> bytes);
  static absl::StatusOr<Tensor> FromBytes(DType dtype, std::vector<int64_t> shape,
                                          std::vector<std::byte>&& bytes);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t num_elements() const { return byte_size() / DTypeSize(dtype_); }
  int64_t byte_size() const { return static_cast<int64_t>(bytes_.size()); }

  absl::Span<const std::byte> bytes() const { return bytes_; }
  absl::Span<std::byte> mutable_bytes() { return absl::MakeSpan(bytes_); }

  // The elements as T; FAILED_PRECONDITION when T does not store dtype().
  template <TensorElement T>
  absl::StatusOr<absl::Span<const T>> data() const {
    if (absl::Status status = CheckElementType(DTypeOf<T>()); !status.ok()) {
      return status;
    }
    return absl::MakeConstSpan(reinterpret_cast<const T*>(bytes_.data()),
                               static_cast<size_t>(num_elements()));
  }

  template <TensorElement T>
  absl::StatusOr<absl::Span<T>> mutable_data() {
    if (absl::Status status = CheckElementType(DTypeOf<T>()); !status.ok()) {
      return status;
    }
    return absl::MakeSpan(reinterpret_cast<T*>(bytes_.data()), static_cast<size_t>(num_elements()));
  }

  // Bitwise: a NaN equals the same NaN, and +0 differs from -0. That is the
  // notion a weight transfer needs.
  friend bool operator==(const Tensor&, const Tensor&) = default;

  // "BF16[2,3]"
  std::string DebugString() const;

 private:
  Tensor(DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes)
      : dtype_(dtype), shape_(std::move(shape)), bytes_(std::move(bytes)) {}

  absl::Status CheckElementType(DType requested) const;

  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  // operator new aligns this to at least 16 bytes, enough for every element
  // type, which is what makes the reinterpret_casts above valid.
  std::vector<std::byte> bytes_;
};

// An F32 copy of a floating-point tensor (F32, BF16 or F16); INVALID_ARGUMENT for integer
// dtypes. Checkpoints store weights in 16 bits; the engine computes in F32.
absl::StatusOr<Tensor> ConvertedToF32(const Tensor& tensor);

}  // namespace tandem

#endif  // TANDEM_COMMON_TENSOR_H_
