// The Metal Shading Language surface the kernels use, for clang without a Metal compiler:
// check_msl.py includes it before a .metal source and parses the result twice,
//
//   C++ for OpenCL 2021, with OpenCL's real address spaces and no optional feature but half
//   and the generic address space (clang needs it for implicit copies; the unqualified
//   pointers it would accept are thread pointers, caught by the C++14 pass), so no double:
//     clang++ -fsyntax-only -target spir64 -x clcpp -cl-std=clc++2021 -cl-no-stdinc \
//         -Xclang -cl-ext=-all,+cl_khr_fp16,+__opencl_c_generic_address_space -nostdinc ...
//   C++14 (MSL 3 is based on C++14), address spaces as clang address_space attributes:
//     clang++ -fsyntax-only -x c++ -std=c++14 -nostdinc -nostdinc++ ...
//
// both with -include cpp/shaders/check/msl.h -I cpp/shaders/check/include -I cpp/shaders
// (check_msl.py has the full command lines). Metal's address spaces are distinct in both,
// so passing or assigning a pointer (or reference) of one where another is expected fails
// as it does in Metal:
//
//   MSL          C++ for OpenCL   C++14
//   device       __global         address_space(1)
//   constant     __constant       address_space(2), and const (the space is read-only)
//   threadgroup  __local          address_space(3)
//   thread       __private        the generic address space 0 (nothing): clang puts locals,
//                                 arguments and `this` there, and a qualified
//                                 address_space(0) would be a different type from them in
//                                 C++, so `thread float (&acc)[4]` could not bind a local.
//
// Values read from any address space are ordinary prvalues, so the builtins that take values
// (simd_sum, fma, min, ...) accept them whatever space they were loaded from. There is no
// C++ standard library (-nostdinc): include/cstdint has the few names kernel_params.h takes
// from <cstdint> outside Metal, as metal_stdlib has them in Metal.
//
// Declarations only: the check is -fsyntax-only, nothing is linked or run.
#pragma once

#if defined(__OPENCL_CPP_VERSION__)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define device __global
#define constant __constant
#define threadgroup __local
#define thread __private
#else
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2))) const
#define threadgroup __attribute__((address_space(3)))
#define thread
#endif
// In C++ for OpenCL `kernel` is a keyword with OpenCL's rules for kernel arguments, not
// Metal's; as a plain function the kernel is checked as C++.
#pragma clang diagnostic ignored "-Wkeyword-macro"
#define kernel

// common.h defines these three only for the Metal compiler (__METAL_VERSION__).
// A function constant: a program-scope variable in the constant address space whose value
// is unknown when compiling (extern: no initializer, nothing for the compiler to fold).
#define FUNCTION_CONSTANT(type, name, index) extern constant type name;
// A threadgroup-memory argument. Metal spells it `threadgroup T *name [[threadgroup(i)]]`,
// but the attribute's name would be rewritten by the `threadgroup` macro, so it is left out
// (check_msl.py reads the attributes from the source as Metal sees it).
#define THREADGROUP_BUFFER(type, name, index) threadgroup type* name
// The instance itself, so that every instance is checked; its attributes (the host name,
// [[kernel]]) are checked on the source as Metal sees it.
#define INSTANTIATE_KERNEL(name, ...) template decltype(__VA_ARGS__) __VA_ARGS__;

namespace metal {
using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;

struct uint2 {
  uint x, y;
};
struct uint3 {
  uint x, y, z;
  uint3() = default;
  constexpr uint3(uint a, uint b, uint c) : x(a), y(b), z(c) {}
};
#if !defined(__OPENCL_CPP_VERSION__)
// Metal's half: clang's storage-only __fp16 (arithmetic promotes to float, as in Metal).
// C++ for OpenCL has `half` built in (cl_khr_fp16).
typedef __fp16 half;
#else
// MSL 3.1's bfloat, in the OpenCL pass only: _Float16 is a 16-bit float type distinct from
// half there (x86's clang 14 has neither it nor __bf16, so the C++14 pass checks the
// kernels' float and half instances, the same template bodies).
typedef _Float16 bfloat;
#define __HAVE_BFLOAT__ 1
#endif
struct float2 {
  float x, y;
  float2() = default;
  constexpr float2(float a, float b) : x(a), y(b) {}
};

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<int>(a) | static_cast<int>(b));
}
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

// Math on float values (no double in Metal; overloads for half are not needed yet).
float exp(float x);
float exp2(float x);
float log(float x);
float fabs(float x);
float abs(float x);
float tanh(float x);
float sqrt(float x);
float rsqrt(float x);
float fma(float a, float b, float c);
float fmin(float a, float b);
float fmax(float a, float b);
int abs(int x);

template <class T>
T min(T a, T b);
template <class T>
T max(T a, T b);
template <class T>
T clamp(T x, T lo, T hi);

// Simdgroup collectives take and return values (thread address space).
template <class T>
T simd_sum(T value);
template <class T>
T simd_max(T value);
template <class T>
T simd_min(T value);
template <class T>
T simd_shuffle(T value, ushort lane);
template <class T>
T simd_broadcast(T value, ushort lane);
template <class T>
T simd_shuffle_down(T value, ushort delta);
template <class T>
T simd_shuffle_up(T value, ushort delta);
template <class T>
T simd_shuffle_xor(T value, ushort mask);

// Simdgroup matrices (MSL 2.3): an 8 x 8 matrix held by a whole simdgroup.
using ulong = unsigned long;
struct ulong2 {
  ulong x, y;
  constexpr ulong2(ulong v = 0) : x(v), y(v) {}
  constexpr ulong2(ulong a, ulong b) : x(a), y(b) {}
};
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  simdgroup_matrix() = default;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
template <class T, int C, int R>
simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value);
template <class T, int C, int R>
void simdgroup_load(thread simdgroup_matrix<T, C, R>& d, const threadgroup T* src,
                    ulong elements_per_row = C, ulong2 matrix_origin = 0,
                    bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_load(thread simdgroup_matrix<T, C, R>& d, const device T* src,
                    ulong elements_per_row = C, ulong2 matrix_origin = 0,
                    bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_store(thread simdgroup_matrix<T, C, R> a, threadgroup T* dst,
                     ulong elements_per_row = C, ulong2 matrix_origin = 0,
                     bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_store(thread simdgroup_matrix<T, C, R> a, device T* dst, ulong elements_per_row = C,
                     ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <class T, int C, int R, int K>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, C, R>& d,
                                   thread simdgroup_matrix<T, K, R>& a,
                                   thread simdgroup_matrix<T, C, K>& b,
                                   thread simdgroup_matrix<T, C, R>& c);
template <class T, int C, int R, int K>
void simdgroup_multiply(thread simdgroup_matrix<T, C, R>& d, thread simdgroup_matrix<T, K, R>& a,
                        thread simdgroup_matrix<T, C, K>& b);
}  // namespace metal

using namespace metal;
