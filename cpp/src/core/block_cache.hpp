// Large arrays from blocks the process has already touched, so that a layer called again
// and again (a training loop) does not fault in fresh pages for its outputs and scratch on
// every call: at T=100 N=32 H=256 an LSTM's training call faulted in about 9,300 fresh pages
// (36 MB), and the kernel's page-fault handling took a tenth of its time.
#pragma once

#include "rnncore/tensor.hpp"

namespace rnncore::detail {

// Tensor::empty, with arrays of kCachedBytes or more taken from the block cache and given
// back to it when their last owner lets go. The cache keeps at most RNNCORE_CACHE_MB
// (default 256) megabytes of idle blocks, dropping the oldest first; 0 turns it off.
Tensor cached_empty(Shape shape, DType dtype);
// glibc's malloc maps blocks from 128 KiB on afresh (and returns them on free) until its
// threshold adapts, which a framework's allocations between calls keep undoing: a GRU(256)
// training step at T=1 in MLX faulted in its two 768 KiB weight gradients (~140 faults).
constexpr size_t kCachedBytes = size_t(128) << 10;

}  // namespace rnncore::detail
