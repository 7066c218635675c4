#ifndef TANDEM_ENGINE_WEIGHT_H_
#define TANDEM_ENGINE_WEIGHT_H_

#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"

namespace tandem::engine {

struct Parameter;

// How a weight's values are stored. kE4M3: FP8 E4M3 bytes with one float scale per block of
// kE4M3BlockSize consecutive values (DeepSeek-V3's 128-wide blocks along a row).
enum class WeightFormat { kF32, kBF16, kF16, kE4M3 };
inline constexpr int64_t kE4M3BlockSize = 128;

// "f32", "bf16", "f16", "e4m3".
absl::string_view WeightFormatName(WeightFormat format);

// A weight as it lies in host memory, before a backend binds it: its format, values, block scales
// (E4M3 only) and, when it trains, its float32 gradient.
struct HostWeight {
  WeightFormat format = WeightFormat::kF32;
  const void* values = nullptr;
  const float* scales = nullptr;
  float* gradient = nullptr;
  int64_t size = 0;  // Elements.

  // A model parameter (float32 today), with its gradient when gradients are enabled.
  static HostWeight Of(Parameter& parameter);
};

// A weight bound to one backend (ModelOps::Bind): its format, and where its values and gradient
// (null when it does not train there) lie in that backend's memory. Bound once, passed to every
// operation as is: no backend translates addresses per call. The graph may move along a weight
// (one expert's rows of a stacked tensor) but cannot read or write through it, as with Ref; only
// backends can (buffer_access.h).
class WeightRef {
 public:
  WeightRef() = default;

  WeightFormat format() const { return format_; }
  // Elements from here to the end of the weight.
  int64_t size() const { return size_; }
  bool null() const { return values_ == nullptr; }
  // Whether operations accumulate this weight's gradient.
  bool trains() const { return gradient_ != nullptr; }

  // The weight `n` elements on. Past the end, or off an E4M3 scale block's start, is a bug in the
  // graph and aborts.
  WeightRef operator+(int64_t n) const {
    if (n < 0 || n > size_) std::abort();
    if (format_ == WeightFormat::kE4M3 && n % kE4M3BlockSize != 0) std::abort();
    WeightRef moved = *this;
    moved.values_ = static_cast<const char*>(values_) + n * ElementBytes();
    if (scales_ != nullptr) moved.scales_ = scales_ + n / kE4M3BlockSize;
    if (gradient_ != nullptr) moved.gradient_ = gradient_ + n;
    moved.size_ = size_ - n;
    return moved;
  }

 private:
  friend class BufferAccess;
  friend class ModelOps;
  WeightRef(WeightFormat format, const void* values, const float* scales, float* gradient,
            int64_t size)
      : format_(format), values_(values), scales_(scales), gradient_(gradient), size_(size) {}
  int64_t ElementBytes() const {
    switch (format_) {
      case WeightFormat::kF32:
        return 4;
      case WeightFormat::kBF16:
      case WeightFormat::kF16:
        return 2;
      case WeightFormat::kE4M3:
        return 1;
    }
    std::abort();
  }

  WeightFormat format_ = WeightFormat::kF32;
  const void* values_ = nullptr;
  const float* scales_ = nullptr;
  float* gradient_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_WEIGHT_H_
