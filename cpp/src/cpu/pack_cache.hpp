// Packed weights kept between calls. Packing R into the fused kernels' panels (and W into
// the bfloat16 projection's pairs) is a pass of 16×16 transposes over weights that, between
// calls, have fallen out of L2: at batch 1 (T=100, H=256, bfloat16) about 14% of a call.
// A caller that runs the same weights again (inference, a decoder's steps) gets the panels
// of its last call, after a comparison of the weights with the copy taken when they were
// packed: any change, in place or not, repacks, so the results never depend on the cache.
#pragma once

#include <cstdint>
#include <memory>

#include "cpu/aligned.hpp"

namespace rnncore::cpu {

// What a packing depends on besides the weights' bytes: where they are (the entry to
// compare with) and every parameter of the layout.
struct PackKey {
  const void* source = nullptr;
  int64_t bytes = 0;       // of the source
  int64_t layout[6] = {};  // the packer's own parameters (shape, gate sets, panel kind)
  bool operator==(const PackKey& o) const;
};

struct PackedWeights {
  LineVector<unsigned char> snapshot;  // the source's bytes when packed
  LineVector<unsigned char> packed;
};

// Whether a source of this size is kept (the cache stays small: a few layers' weights).
bool pack_cache_accepts(int64_t bytes);

// The entry for key whose snapshot still equals the source's bytes, or null.
std::shared_ptr<const PackedWeights> pack_cache_find(const PackKey& key);

// A new entry of `packed_bytes` for key, its snapshot taken now: pack into it, then
// pack_cache_insert it.
std::shared_ptr<PackedWeights> pack_cache_entry(const PackKey& key, int64_t packed_bytes);
void pack_cache_insert(const PackKey& key, std::shared_ptr<const PackedWeights> entry);

}  // namespace rnncore::cpu
