#include "rnncore/tensor.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/block_cache.hpp"
#include "rnncore/error.hpp"

namespace rnncore {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
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

namespace {

// Bytes of an array of `shape`, refusing counts 64-bit arithmetic cannot hold.
size_t checked_bytes(const Shape& shape, DType dtype) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape_numel(shape), dtype_size(dtype), &bytes) ||
      bytes > (int64_t(1) << 62))
    throw OutOfMemoryError("an array of shape " + shape_to_string(shape) + " (" +
                           dtype_name(dtype) + ") has too many bytes to allocate");
  return static_cast<size_t>(bytes);
}

[[noreturn]] void out_of_memory(size_t bytes, const Shape& shape, DType dtype) {
  throw OutOfMemoryError("could not allocate " + std::to_string(bytes) +
                         " bytes for an array of shape " + shape_to_string(shape) + " (" +
                         dtype_name(dtype) + ")");
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  // 64-byte alignment for vector loads; at least one byte so data() is never null.
  const size_t bytes = checked_bytes(t.shape_, dtype);
  const size_t rounded = (bytes + 63) / 64 * 64 + 64 * (bytes == 0);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) out_of_memory(bytes, t.shape_, dtype);
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  // calloc: a large block comes from fresh pages the OS has zeroed, so pages the caller
  // never writes are never touched. Over-allocated by 64 bytes for the alignment.
  const size_t bytes = checked_bytes(t.shape_, dtype);
  void* base = std::calloc(bytes + 64, 1);
  if (!base) out_of_memory(bytes, t.shape_, dtype);
  void* aligned =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(base) + 63) & ~uintptr_t(63));
  t.storage_ = std::shared_ptr<void>(aligned, [base](void*) { std::free(base); });
  return t;
}

}  // namespace rnncore

namespace rnncore::detail {
namespace {

class BlockCache {
 public:
  // Never destroyed: a Python array may give its block back after static destructors ran.
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;
    return *cache;
  }
  // A block of at least `bytes` (64-aligned), its capacity in *cap; null when out of memory.
  void* take(size_t bytes, size_t* cap) {
    {
      std::lock_guard<std::mutex> lock(m_);
      // The smallest idle block that fits and wastes at most a quarter of itself.
      size_t best = blocks_.size();
      for (size_t i = 0; i < blocks_.size(); ++i) {
        const size_t c = blocks_[i].first;
        if (c >= bytes && c - bytes <= c / 4 && (best == blocks_.size() || c < blocks_[best].first))
          best = i;
      }
      if (best < blocks_.size()) {
        auto [c, p] = blocks_[best];
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(best));
        held_ -= c;
        *cap = c;
        return p;
      }
    }
    *cap = (bytes + 4095) / 4096 * 4096;
    return std::aligned_alloc(64, *cap);
  }
  void give(void* p, size_t cap) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (cap > limit_) {
        drop.push_back(p);
      } else {
        size_t i = 0;
        while (held_ + cap > limit_) {
          drop.push_back(blocks_[i].second);
          held_ -= blocks_[i++].first;
        }
        blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        blocks_.emplace_back(cap, p);
        held_ += cap;
      }
    }
    for (void* q : drop) std::free(q);
  }

 private:
  BlockCache() {
    const char* v = std::getenv("RNNCORE_CACHE_MB");
    char* end = nullptr;
    const long long mb = v && *v ? std::strtoll(v, &end, 10) : 256;
    limit_ = end && *end ? size_t(256) << 20 : static_cast<size_t>(mb < 0 ? 0 : mb) << 20;
  }
  std::mutex m_;
  std::vector<std::pair<size_t, void*>> blocks_;  // idle blocks, oldest first
  size_t held_ = 0, limit_ = 0;
};

}  // namespace

Tensor cached_empty(Shape shape, DType dtype) {
  const size_t bytes = checked_bytes(shape, dtype);
  if (bytes < kCachedBytes) return Tensor::empty(std::move(shape), dtype);
  size_t cap = 0;
  void* p = BlockCache::instance().take(bytes, &cap);
  if (!p) out_of_memory(bytes, shape, dtype);
  return Tensor::adopt(
      std::shared_ptr<void>(p, [cap](void* q) { BlockCache::instance().give(q, cap); }),
      std::move(shape), dtype);
}

}  // namespace rnncore::detail

namespace rnncore {

Tensor Tensor::adopt(std::shared_ptr<void> storage, Shape shape, DType dtype) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

}  // namespace rnncore
