#include "cpu/pack_cache.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace rnncore::cpu {

namespace {

// At most a few layers' weights, each of up to 4 MiB (an LSTM's float32 R at H = 512):
// beyond that the packing is a small part of the work that streams the weights anyway.
constexpr int64_t kMaxSourceBytes = int64_t(4) << 20, kMaxTotalBytes = int64_t(64) << 20;
constexpr size_t kMaxEntries = 16;

struct Slot {
  PackKey key;
  std::shared_ptr<const PackedWeights> entry;
  uint64_t used = 0;
};

struct Cache {
  std::mutex m;
  std::vector<Slot> slots;
  uint64_t clock = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: no order problem at exit
  return *c;
}

// RNNCORE_PACK_CACHE=0 turns the cache off (a test compares the two).
bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RNNCORE_PACK_CACHE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

int64_t bytes_of(const Slot& s) {
  return static_cast<int64_t>(s.entry->snapshot.size() + s.entry->packed.size());
}

}  // namespace

bool PackKey::operator==(const PackKey& o) const {
  return source == o.source && bytes == o.bytes && std::equal(layout, layout + 6, o.layout);
}

bool pack_cache_accepts(int64_t bytes) {
  return enabled() && bytes > 0 && bytes <= kMaxSourceBytes;
}

std::shared_ptr<const PackedWeights> pack_cache_find(const PackKey& key) {
  if (!pack_cache_accepts(key.bytes)) return nullptr;
  std::shared_ptr<const PackedWeights> e;
  {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.m);
    for (Slot& s : c.slots)
      if (s.key == key) {
        s.used = ++c.clock;
        e = s.entry;
        break;
      }
  }
  if (!e || std::memcmp(e->snapshot.data(), key.source, static_cast<size_t>(key.bytes)) != 0)
    return nullptr;
  return e;
}

std::shared_ptr<PackedWeights> pack_cache_entry(const PackKey& key, int64_t packed_bytes) {
  auto e = std::make_shared<PackedWeights>();
  const auto* src = static_cast<const unsigned char*>(key.source);
  e->snapshot.assign(src, src + key.bytes);
  e->packed.resize(static_cast<size_t>(packed_bytes));
  return e;
}

void pack_cache_insert(const PackKey& key, std::shared_ptr<const PackedWeights> entry) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.m);
  // The key's old entry (the weights changed) goes; then the least recently used ones
  // while over the limits.
  c.slots.erase(
      std::remove_if(c.slots.begin(), c.slots.end(), [&](const Slot& s) { return s.key == key; }),
      c.slots.end());
  c.slots.push_back({key, std::move(entry), ++c.clock});
  const auto total = [&] {
    int64_t t = 0;
    for (const Slot& s : c.slots) t += bytes_of(s);
    return t;
  };
  while (c.slots.size() > 1 && (c.slots.size() > kMaxEntries || total() > kMaxTotalBytes)) {
    auto lru = std::min_element(c.slots.begin(), c.slots.end(),
                                [](const Slot& a, const Slot& b) { return a.used < b.used; });
    c.slots.erase(lru);
  }
}

}  // namespace rnncore::cpu
