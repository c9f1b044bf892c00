// Kernels that exercise the host emulator itself (tests/cpp/test_emulator.cpp): a correct
// use of threadgroup memory, the same without its barrier, barriers that some threads skip
// or reach at different call sites, simdgroup reductions and shuffles over partial
// simdgroups, a simd operation in divergent control flow, function constants, arguments at
// other indices than the tests' host code binds, threadgroups that observe their order, and
// a kernel abandoned in a deep frame followed by one with a large frame. Valid Metal.
#include "common.h"

#define SELFTEST_PARAMS                                                                  \
  device float *data [[buffer(0)]], THREADGROUP_BUFFER(float, shared, 0),                \
      uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]], \
      uint3 tptg [[threads_per_threadgroup]]

// out[i] = in[i] + in[(i + 1) % n] through threadgroup memory.
kernel void selftest_neighbour_sum(SELFTEST_PARAMS) {
  const uint n = tptg.x;
  shared[tid] = data[tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  data[tid] = shared[tid] + shared[(tid + 1) % n];
}

// The same with the barrier missing: a race on the GPU, wrong in the emulator.
kernel void selftest_neighbour_sum_no_barrier(SELFTEST_PARAMS) {
  const uint n = tptg.x;
  shared[tid] = data[tid];
  data[tid] = shared[tid] + shared[(tid + 1) % n];
}

// Only the first half of the threadgroup reaches the barrier.
kernel void selftest_divergent_barrier(SELFTEST_PARAMS) {
  if (tid < tptg.x / 2) threadgroup_barrier(mem_flags::mem_threadgroup);
  data[tid] = 1.0f;
}

// Odd and even threads wait at different barriers (different work around each, so the
// compiler cannot merge the two calls).
kernel void selftest_different_barriers(SELFTEST_PARAMS) {
  if (tid % 2 == 1) {
    shared[tid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    data[tid] = shared[tid - 1];
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    data[tid] = 2.0f * data[tid];
  }
}

// Each lane gets the sum over its simdgroup's active lanes.
kernel void selftest_simd_sum(SELFTEST_PARAMS) { data[tid] = simd_sum(data[tid]); }

// Each lane reads the value of lane + 8; past the active lanes that is undefined.
kernel void selftest_simd_shuffle_down(SELFTEST_PARAMS) {
  data[tid] = simd_shuffle_down(data[tid], ushort(8));
}

// Half the lanes of a simdgroup call simd_sum: undefined on the GPU.
kernel void selftest_divergent_simd(SELFTEST_PARAMS) {
  if (lane < 16) data[tid] = simd_sum(data[tid]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

FUNCTION_CONSTANT(int, selftest_scale, 63)
FUNCTION_CONSTANT(bool, selftest_has_extra, 62)

// Scales by a function constant.
kernel void selftest_scaled(device float* data [[buffer(0)]],
                            uint tid [[thread_index_in_threadgroup]]) {
  data[tid] *= float(selftest_scale);
}

// An argument that exists only when a function constant is true.
kernel void selftest_conditional(device float* data [[buffer(0)]],
                                 device const float* extra
                                 [[buffer(1), function_constant(selftest_has_extra)]],
                                 uint tid [[thread_index_in_threadgroup]]) {
  if (selftest_has_extra) data[tid] += extra[tid];
}

// Its data at index 1, where the tests' host code binds index 0 (as for the kernels above):
// on Metal the kernel would find nothing bound at index 1.
kernel void selftest_data_at_index_one(device float* data [[buffer(1)]],
                                       uint tid [[thread_index_in_threadgroup]]) {
  data[tid] += 1.0f;
}

// Output at index 0, input at index 1: the arguments bind by the indices, not the order.
kernel void selftest_swapped_indices(device const float* in [[buffer(1)]],
                                     device float* out [[buffer(0)]],
                                     uint tid [[thread_index_in_threadgroup]]) {
  out[tid] = 2.0f * in[tid];
}

// Threadgroups of one thread that communicate through device memory, which no kernel may
// rely on (a race on the GPU): each writes how many threadgroups ran before it,
// data[1 + g] = data[0]++. On one OS thread that is the order the threadgroups ran in.
kernel void selftest_group_order(device float* data [[buffer(0)]],
                                 uint3 tgid [[threadgroup_position_in_grid]]) {
  data[1 + tgid.x] = data[0];
  data[0] += 1.0f;
}
// Threads that wait at a barrier the other half skips, with live frames full of arrays
// (AddressSanitizer puts redzones between them): the scheduler error abandons them there.
static float sum_around_barrier(device float* data, uint tid, uint n) {
  float a[7], b[5], c[3];
  for (uint i = 0; i < 7; ++i) a[i] = data[tid] + float(i);
  for (uint i = 0; i < 5; ++i) b[i] = a[(tid + i) % 7];
  for (uint i = 0; i < 3; ++i) c[i] = b[(tid + i) % 5];
  if (tid < n / 2) threadgroup_barrier(mem_flags::mem_threadgroup);
  return a[tid % 7] + b[tid % 5] + c[tid % 3];
}

kernel void selftest_abandoned_in_a_deep_frame(SELFTEST_PARAMS) {
  data[tid] = sum_around_barrier(data, tid, tptg.x);
}

// A frame with one large array over the stack the abandoned frames used.
kernel void selftest_large_frame(SELFTEST_PARAMS) {
  float big[512];
  for (uint i = 0; i < 512; ++i) big[i] = data[tid] + float(i);
  data[tid] = big[(tid * 37) % 512] - float((tid * 37) % 512);
}

// Simdgroup matrices over data = [A 8x8 | B 8x8 | C | At | W 8x16], row-major: C = A Bt + 1
// (B loaded transposed), At = A stored transposed, and A stored into W at column 8.
kernel void selftest_simdgroup_matrix(SELFTEST_PARAMS) {
  simdgroup_float8x8 a, b, c = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
  simdgroup_load(a, data);
  simdgroup_load(b, data + 64, 8, ulong2(0, 0), true);
  simdgroup_multiply_accumulate(c, a, b, c);
  simdgroup_store(c, data + 128);
  simdgroup_store(a, data + 192, 8, 0, true);
  simdgroup_store(a, data + 256, 16, ulong2(8, 0));
}

// Half the lanes load a matrix: undefined on the GPU.
kernel void selftest_simdgroup_matrix_divergent(SELFTEST_PARAMS) {
  simdgroup_float8x8 a;
  if (lane < 16) simdgroup_load(a, data);
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// Every lane loads from another address: undefined on the GPU.
kernel void selftest_simdgroup_matrix_nonuniform(SELFTEST_PARAMS) {
  simdgroup_float8x8 a;
  simdgroup_load(a, data + lane);
  simdgroup_store(a, data + 64);
}
