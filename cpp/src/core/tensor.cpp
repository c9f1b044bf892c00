#include "rnncore/tensor.hpp"

#include <cstdlib>
#include <cstring>

#include "rnncore/error.hpp"

namespace rnncore {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
  }
  return "?";
}

int64_t dtype_size(DType d) { return d == DType::Float64 ? 8 : d == DType::Float32 ? 4 : 2; }

std::string shape_to_string(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  if (s.size() == 1) r += ",";
  return r + ")";
}

int64_t shape_numel(const Shape& s) {
  for (int64_t d : s)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      throw ValueError("shape " + shape_to_string(s) + " has no 64-bit element count");
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  // 64-byte alignment for vector loads; at least one byte so data() is never null.
  int64_t bytes = 0;
  if (__builtin_mul_overflow(t.numel(), dtype_size(dtype), &bytes) || bytes > (int64_t(1) << 62))
    throw OutOfMemoryError("an array of shape " + shape_to_string(t.shape_) + " (" +
                           dtype_name(dtype) + ") has too many bytes to allocate");
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64 + 64 * (bytes == 0);
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    throw OutOfMemoryError("could not allocate " + std::to_string(bytes) +
                           " bytes for an array of shape " + shape_to_string(t.shape_) + " (" +
                           dtype_name(dtype) + ")");
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.data(), 0, static_cast<size_t>(t.nbytes()));
  return t;
}

}  // namespace rnncore

namespace rnncore {

Tensor Tensor::adopt(std::shared_ptr<void> storage, Shape shape, DType dtype) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

}  // namespace rnncore
