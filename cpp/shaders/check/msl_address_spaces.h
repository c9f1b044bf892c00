// An address-space check of the Metal kernels without a Metal compiler: included before a
// .metal source, it lets clang parse the kernel as C++ with Metal's address spaces mapped to
// distinct clang address spaces, so that mixing them is a compile error, as it is in Metal:
//
//   clang++ -fsyntax-only -std=c++17 -Wall -Wextra -Werror -Wno-unknown-attributes \
//       -Wno-unused-parameter -Wno-duplicate-decl-specifier \
//       -include cpp/shaders/check/msl_address_spaces.h -I cpp/shaders -x c++ file.metal
//
// (cpp/shaders/check/check_address_spaces.py runs it on every kernel.) The host emulator's
// shim (cpp/src/metal/emulator/shim.hpp) defines the qualifiers as nothing, so it cannot see
// a threadgroup pointer passed where a device pointer is expected; this header can.
//
//   device       address_space(1)
//   constant     address_space(2), and const (the constant address space is read-only)
//   threadgroup  address_space(3)
//   thread       the generic address space 0 (nothing): clang puts locals, arguments and
//                `this` there, and a qualified address_space(0) would be a different type
//                from them in C++, so `thread float (&acc)[4]` could not bind a local array.
//
// A device, constant or threadgroup pointer still cannot be passed as a thread (plain)
// pointer, nor the other way round: clang never converts between address spaces implicitly.
// Values read from any address space are ordinary prvalues, so the builtins that take values
// (simd_sum, fma, min, ...) accept them whatever space they were loaded from.
//
// Declarations only: the check is -fsyntax-only, nothing is linked or run.
#pragma once

// Standard headers first: the qualifier macros below must not rewrite their identifiers
// (kernel_params.h includes <cstdint> again; its include guard makes that a no-op).
#include <cstdint>

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2))) const
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel

// common.h defines these three only for the Metal compiler (__METAL_VERSION__).
// A function constant: a program-scope variable in the constant address space whose value
// is unknown when compiling (extern: no initializer, nothing for the compiler to fold).
#define FUNCTION_CONSTANT(type, name, index) extern constant type name;
// Registration is the emulator's business; here nothing.
#define REGISTER_KERNEL(adapter, name)
// A threadgroup-memory argument. Metal spells it `threadgroup T *name [[threadgroup(i)]]`,
// but the attribute's name would be rewritten by the `threadgroup` macro, so it is left out.
#define THREADGROUP_BUFFER(type, name, index) threadgroup type* name

namespace metal {
using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;

struct uint2 {
  uint x, y;
};
struct uint3 {
  uint x, y, z;
};
// Metal's half: clang's storage-only __fp16 (arithmetic promotes to float, as in Metal).
typedef __fp16 half;
struct float2 {
  float x, y;
  float2() = default;
  constexpr float2(float a, float b) : x(a), y(b) {}
};

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
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
}  // namespace metal

using namespace metal;
