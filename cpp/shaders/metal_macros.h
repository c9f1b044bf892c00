// The project's kernel macros as the Metal compiler reads them (common.h includes this under
// __METAL_VERSION__). The host emulator (cpp/src/metal/emulator/shim.hpp) and the clang
// checks (check/msl.h) define the same three for their compilers.
#pragma once

#define FUNCTION_CONSTANT(type, name, index) constant type name [[function_constant(index)]];
// A threadgroup-memory argument (the emulator gives all threads of a group one block).
#define THREADGROUP_BUFFER(type, name, index) threadgroup type* name [[threadgroup(index)]]
// One instance of a kernel template, under the name the plan dispatches (MLX's pattern).
#define INSTANTIATE_KERNEL(name, ...) \
  template [[host_name(#name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__;
