// Fused float32 recurrences: the recurrent weight packed once per call in the order the
// step kernel reads it, a register-blocked product whose epilogue does the gate math in
// L1, and a team of threads that splits the hidden units and meets once per step.
#pragma once

#include <cstdint>

#include "core/backend.hpp"

namespace rnncore::cpu {

class SpinBarrier;

// The per-ISA entry points (fused_kernels.hpp compiled once per vector width).
struct FusedKernels {
  int width;  // floats per vector
  const char* isa;
  // Runs one direction with `team` threads; tid is this thread's index. Every thread of
  // the team calls it with the same arguments; `shared` is the call's workspace.
  void (*forward)(const detail::Problem& p, const detail::DirectionForward& a, float* shared,
                  SpinBarrier* barrier, int tid, int team);
  // Floats of workspace one direction needs (packed weights and per-step buffers).
  int64_t (*workspace)(const detail::Problem& p);
};

// The best kernels this CPU runs.
const FusedKernels& fused_kernels();

// Runs the forward recurrence of every direction on the pool; float32 only.
void fused_forward(const detail::Problem& p, const detail::DirectionForward* dirs);

}  // namespace rnncore::cpu
