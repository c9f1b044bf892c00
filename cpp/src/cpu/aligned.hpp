// Arrays on 64-byte lines: a 64-byte vector load or tile row off a line's start touches two
// lines, and malloc's large blocks start 16 bytes past a page (the tile GEMMs of bfloat16
// gradients ran 1.3-2.3× faster on line-aligned packed operands).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace rnncore::cpu {

template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const LineAllocator<U>&) const {
    return false;
  }
};

template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace rnncore::cpu
