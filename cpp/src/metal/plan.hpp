// The plan layer of the Metal backend: for an op and its shapes, every dispatch (pipeline
// name and function constants, buffers and byte offsets, setBytes payloads, threadgroup
// memory, grid) and the workspace it needs. Plain C++: both executors (metal-cpp on
// Apple, the host emulator everywhere) run the same plans.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace rnncore::metal {

// The arrays an op touches. Inputs and outputs are the caller's; the rest is workspace the
// executor allocates for one call.
enum class Buffer : uint8_t {
  Source,
  InputWeight,
  RecurrentWeight,
  Bias,
  InitState,
  InitCell,
  Mask,
  Peephole,
  SecondaryBias,
  State,           // forward outputs
  Cell,            // LSTM cell output
  ZState,          // training state (written by the forward, read by the gradients)
  StateFwd,        // gradient inputs: GRU output_fwd
  CellFwd,         // LSTM cell_output_fwd
  SourceGradient,  // dL/dstate
  StateGradient,
  CellGradient,  // [N, D*H] or [T, N, D*H]
  DSource,       // gradient outputs
  DInputWeight,
  DRecurrentWeight,
  DBias,
  DInitState,
  DInitCell,
  DPeephole,
  DSecondaryBias,
  Projected,    // workspace: x' = source * W^T + bias
  CellScratch,  // LSTM cell when no cell output is returned
  StepScratch,  // GRU reset-before per-step z gate and r * h~
  RecurrentT,   // gradients: R^T
  DProjected,   // dX' (when there is an input weight; else it is DSource)
  HTilde,       // masked previous state of every step
  UInput,       // GRU reset-before: r * h~ of every step
  RDelta,       // GRU reset-after: the deltas R sees
  Carry,        // [3, N, D*H] carried between gradient steps
  CellPrev,     // LSTM with peepholes: previous cell of every step
  Partials,     // split-K GEMM and row-block column-sum partials, summed by a second pass
  Count,        // not a buffer: the number of them
};
inline constexpr int kBufferCount = static_cast<int>(Buffer::Count);
const char* buffer_name(Buffer b);
bool is_workspace(Buffer b);

struct Binding {
  uint32_t index;
  Buffer buffer;
  int64_t offset;  // bytes
};

struct BytesArg {
  uint32_t index;
  std::vector<uint8_t> data;
};

struct FunctionConstant {
  enum class Type : uint8_t { Bool, Int };
  uint32_t index;
  Type type;
  int32_t value;
};

struct Size3 {
  uint64_t x = 1, y = 1, z = 1;
  uint64_t volume() const { return x * y * z; }
};

struct Dispatch {
  std::string kernel;  // function name in the metallib
  std::vector<FunctionConstant> constants;
  std::vector<Binding> buffers;
  std::vector<BytesArg> bytes;
  uint32_t threadgroup_memory = 0;  // bytes at [[threadgroup(0)]], 0 for none
  Size3 threadgroups;               // grid, in threadgroups
  Size3 threads;                    // threads per threadgroup
  // The kernel works with any threadgroup of whole simdgroups up to `threads` (a persistent
  // kernel): an executor may give it fewer where a pipeline allows fewer threads.
  bool adapts_threads = false;

  // Kernel name plus constant values: the key of the pipeline cache.
  std::string pipeline_key() const;
};

struct Plan {
  std::vector<Dispatch> dispatches;
  // Size in bytes of every buffer the plan reads or writes (0: not used, or an empty array
  // such as a source with I = 0: bound, never read; executors bind a placeholder).
  std::array<int64_t, kBufferCount> sizes{};
  // Buffers the plan writes (outputs; workspace too). An executor may only bind memory it
  // can write in place here.
  std::array<bool, kBufferCount> writes{};
  bool written(Buffer b) const { return writes[static_cast<int>(b)]; }
  // The storage type (float32, float16 or bfloat16), its bytes per element, and each
  // buffer's (the gradients keep their intermediates in float32 whatever the storage type).
  DType storage = DType::Float32;
  int64_t element_size = 4;
  std::array<int64_t, kBufferCount> element_sizes{};
  int64_t size(Buffer b) const { return sizes[static_cast<int>(b)]; }
};

// Limits of the devices the kernels target (Apple GPUs, Metal 3).
struct Limits {
  static constexpr uint32_t max_threadgroup_memory = 32 * 1024;
  static constexpr uint32_t max_threads_per_threadgroup = 1024;
  static constexpr size_t max_set_bytes = 4 * 1024;
  // Buffer offsets are multiples of the element size (Metal: aligned to the data type).
};

// Shapes of the mask as given (it broadcasts to [N, D*H]); rank -1 when absent.
struct MaskShape {
  int64_t rows = 1, cols = 1;
};

// Refuses (ValueError naming the op) a problem with an array past the kernels' 32-bit
// element indices; the plans call it, and the backend before it allocates anything.
void check_extents(const detail::Problem& p, bool gradients);

// The dispatches of a forward op (float32, or float16 or bfloat16 storage): the input projection,
// then one step dispatch per time step (two for a reset-before GRU). Refuses what check_extents
// refuses.
Plan plan_forward(const detail::Problem& p, const MaskShape& mask);

// Which gradient inputs and outputs a gradient call has (beyond what Problem says).
struct GradientShape {
  MaskShape mask;
  bool dh_final = false;  // state_gradient
  bool dc_final = false;  // LSTM cell_gradient [N, D*H]
  bool dc_steps = false;  // LSTM cell_gradient [T, N, D*H]
  bool want_db2 = false;  // GRU reset-after with a secondary bias
};

// The dispatches of a gradient op (float32, or float16 or bfloat16 storage): R^T, the gradient
// steps from T-1 down to 0 (two dispatches per step for a reset-before GRU) and one for the
// initial-state gradients, then dR, dsource, dW as GEMMs and the bias, secondary-bias and peephole
// gradients as column sums.
Plan plan_gradients(const detail::Problem& p, const GradientShape& g);

// Checks a plan against Limits; throws rnncore::Error describing the first violation.
void check_limits(const Plan& plan);

}  // namespace rnncore::metal
