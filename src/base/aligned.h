// 64-byte aligned heap buffers for kernels (explicit owner, explicit copies).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace pagoda {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  // Discards contents; new memory is zeroed.
  void resize(size_t n) {
    if (n == n_) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = bytes ? std::aligned_alloc(64, bytes) : nullptr;
    if (bytes && !p) throw std::bad_alloc();
    if (p) std::memset(p, 0, bytes);
    ptr_.reset(static_cast<T*>(p));
    n_ = n;
  }
  T* data() { return ptr_.get(); }
  const T* data() const { return ptr_.get(); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return ptr_.get()[i]; }
  const T& operator[](size_t i) const { return ptr_.get()[i]; }

 private:
  std::unique_ptr<T, AlignedFree> ptr_;
  size_t n_ = 0;
};

}  // namespace pagoda
