#include "engine/weight.h"

#include "engine/parameters.h"

namespace tandem::engine {

absl::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kE4M3:
      return "e4m3";
  }
  return "unknown";
}

HostWeight HostWeight::Of(Parameter& parameter) {
  return HostWeight{.format = WeightFormat::kF32,
                    .values = parameter.value.data(),
                    .gradient = parameter.grad_or_null(),
                    .size = parameter.size()};
}

}  // namespace tandem::engine
