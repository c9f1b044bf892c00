// Tensor (owning) and TensorView (non-owning) for dense, C-contiguous arrays.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace rnncore {

// Float16 and BFloat16 are storage types (the arithmetic is float32): float16 on every
// device, bfloat16 on the CPU.
enum class DType : int32_t { Float32 = 0, Float64 = 1, Float16 = 2, BFloat16 = 3 };

const char* dtype_name(DType d);
int64_t dtype_size(DType d);

template <class T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "rnncore computes in float or double");
  return std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
}

using Shape = std::vector<int64_t>;

// "(4, 32)"; "()" for a scalar.
std::string shape_to_string(const Shape& s);
int64_t shape_numel(const Shape& s);

// A C-contiguous array owned by someone else, read in place.
struct TensorView {
  const void* data = nullptr;
  Shape shape;
  DType dtype = DType::Float32;

  TensorView() = default;
  TensorView(const void* d, Shape s, DType t) : data(d), shape(std::move(s)), dtype(t) {}
  template <class T>
  TensorView(const T* d, Shape s) : data(d), shape(std::move(s)), dtype(dtype_of<T>()) {}

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
  template <class T>
  const T* ptr() const {
    return static_cast<const T*>(data);
  }
};

// A C-contiguous array that owns its storage (shared, so copies are cheap and the
// Python layer can hand the same memory to numpy without a copy).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // Takes shared ownership of storage someone else allocated (a device buffer's contents).
  static Tensor adopt(std::shared_ptr<void> storage, Shape shape, DType dtype);

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }
  template <class T>
  T* ptr() {
    return static_cast<T*>(storage_.get());
  }
  template <class T>
  const T* ptr() const {
    return static_cast<const T*>(storage_.get());
  }
  const std::shared_ptr<void>& storage() const { return storage_; }
  TensorView view() const { return TensorView(storage_.get(), shape_, dtype_); }

 private:
  std::shared_ptr<void> storage_;
  Shape shape_;
  DType dtype_ = DType::Float32;
};

}  // namespace rnncore
