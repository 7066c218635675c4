#ifndef TANDEM_ENGINE_BUFFER_ACCESS_H_
#define TANDEM_ENGINE_BUFFER_ACCESS_H_

#include <cstdint>

#include "engine/buffer.h"

namespace tandem::engine {

// The addresses behind Refs: for backends (ModelOps implementations) and the glue
// that moves their memory (expert exchanges), never for the model graph, which must work on
// memory it cannot read.
class BufferAccess {
 public:
  template <typename T>
  static T* Address(Ref<T> ref) {
    return ref.address_;
  }
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BUFFER_ACCESS_H_
