// Rows of different lengths (docs/semantics.md, "Sequence lengths") on any backend: the rows
// are sorted by length once, each direction runs as a chain of backend calls over time
// segments, each call over the rows still active (a prefix of the sorted rows), and the
// results are placed back. The cost follows the sum of the lengths, not N·T.
#pragma once

#include <cstdint>

#include "core/backend.hpp"

namespace rnncore::detail {

// Both write every output of `a` (the wrapper allocated them zeroed: positions past a row's
// length are not written).
// lengths: [N], validated to lie in [0, T] and not all equal to T.
void forward_with_lengths(Backend& be, const Problem& p, const ForwardArrays& a,
                          const int64_t* lengths);
void backward_with_lengths(Backend& be, const Problem& p, const BackwardArrays& a,
                           const int64_t* lengths);

}  // namespace rnncore::detail
