// The Metal backend: whole ops (forward and gradients) through the plan layer, run by an
// executor (the GPU through metal-cpp, or the host emulator). Mirrors cpu/backend.cpp.
#pragma once

#include "core/backend.hpp"
#include "metal/executor.hpp"

namespace rnncore::metal {

detail::Backend& backend_on(Executor& executor);

}  // namespace rnncore::metal
