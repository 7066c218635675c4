#ifndef TANDEM_ENGINE_BUFFER_ACCESS_H_
#define TANDEM_ENGINE_BUFFER_ACCESS_H_

#include <cstdint>

#include "engine/buffer.h"
#include "engine/weight.h"

namespace tandem::engine {

// The addresses behind Refs and WeightRefs: for backends (ModelOps implementations) and the glue
// that moves their memory (expert exchanges), never for the model graph, which must work on
// memory it cannot read.
class BufferAccess {
 public:
  template <typename T>
  static T* Address(Ref<T> ref) {
    return ref.address_;
  }
  // A weight's values, as the type its format stores (float for kF32), in its backend's memory.
  template <typename T>
  static const T* Values(WeightRef weight) {
    return static_cast<const T*>(weight.values_);
  }
  // Its gradient; null when it does not train.
  static float* Gradient(WeightRef weight) { return weight.gradient_; }
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BUFFER_ACCESS_H_
