// rnncore: MPSGraph's recurrent layers (single-gate RNN, LSTM, GRU) on the CPU and on
// Apple GPUs. The contract: docs/semantics.md; the API: docs/api.md.
#pragma once

#include "rnncore/descriptors.hpp"
#include "rnncore/device.hpp"
#include "rnncore/error.hpp"
#include "rnncore/info.hpp"
#include "rnncore/metal_counts.hpp"
#include "rnncore/ops.hpp"
#include "rnncore/tensor.hpp"
