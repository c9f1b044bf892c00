// Included first when msl_source.py preprocesses a source as Metal sees it: the project's
// macros as common.h spells them for the Metal compiler, so that a file checked on its own
// (a test snippet) reads as one that includes common.h. common.h's own definitions, the same
// tokens, replace these where it is included.
#define FUNCTION_CONSTANT(type, name, index) constant type name [[function_constant(index)]];
#define THREADGROUP_BUFFER(type, name, index) threadgroup type* name [[threadgroup(index)]]
#define INSTANTIATE_KERNEL(name, ...) \
  template [[host_name(#name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__;
