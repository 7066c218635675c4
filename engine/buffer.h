#ifndef TANDEM_ENGINE_BUFFER_H_
#define TANDEM_ENGINE_BUFFER_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <utility>

namespace tandem::engine {

class BufferAccess;
class ModelOps;

// A place in a backend's memory (host or device) and how many elements lie from there to the end
// of its buffer: what the model graph hands to ModelOps. The graph may move along it but cannot
// read or write through it — only a backend can (buffer_access.h) — so the same graph runs over
// device memory, and a backend can check every operation's extent against size().
template <typename T>
class Ref {
 public:
  Ref() = default;
  // The reference `n` elements on; n past the end is a bug in the graph and aborts.
  Ref operator+(int64_t n) const {
    if (n < 0 || n > size_) std::abort();
    return Ref(address_ + n, size_ - n);
  }
  int64_t size() const { return size_; }
  bool null() const { return address_ == nullptr; }
  template <typename U = T, typename = std::enable_if_t<!std::is_const_v<U>>>
  operator Ref<const U>() const {
    return Ref<const U>(address_, size_);
  }

 private:
  friend class BufferAccess;
  template <typename>
  friend class Ref;
  template <typename>
  friend class Buffer;
  Ref(T* address, int64_t size) : address_(address), size_(size) {}

  T* address_ = nullptr;
  int64_t size_ = 0;
};

// Memory a backend allocated (ModelOps::Resize and friends), which the graph owns and passes to
// operations by ref(). Move-only: a copy of the contents is an operation (ModelOps::Copy). A
// resize that grows allocates anew without keeping the contents.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    memory_ = std::move(other.memory_);
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  int64_t size() const { return size_; }
  Ref<T> ref() { return Ref<T>(memory_.get(), size_); }
  Ref<const T> ref() const { return Ref<const T>(memory_.get(), size_); }

 private:
  friend class BufferAccess;
  friend class ModelOps;
  std::shared_ptr<T> memory_;
  int64_t capacity_ = 0;
  int64_t size_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_BUFFER_H_
