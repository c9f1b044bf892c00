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
  // Packs B [K, n] (row-major) into column panels of `width` for matmul: ceil(n/width)
  // panels of K*width floats.
  void (*pack_columns)(const float* B, int64_t K, int64_t n, float* out);
  // C[M, n] = A[M, K] B (or += when accumulate), B packed by pack_columns.
  void (*matmul)(const float* A, int64_t lda, int64_t M, int64_t K, const float* packed,
                 int64_t n, float* C, int64_t ldc, bool accumulate);
};

// The best kernels this CPU runs.
const FusedKernels& fused_kernels();

// Floats pack_columns writes for B [K, n].
int64_t packed_columns_size(int64_t K, int64_t n);

// Runs the forward recurrence of every direction on the pool; float32 only.
void fused_forward(const detail::Problem& p, const detail::DirectionForward* dirs);

}  // namespace rnncore::cpu
