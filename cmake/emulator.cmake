# The host emulator's table of kernels: which argument each attribute of a kernel's signature
# binds ([[buffer(i)]], [[threadgroup(i)]], thread positions), read from the .metal sources
# by cpp/shaders/check/emulator_signatures.py with the C++ compiler's preprocessor, so the
# emulator binds arguments as Metal does, from the signatures.

find_package(Python3 COMPONENTS Interpreter REQUIRED)

# rnncore_emulator_signatures(<target> <output> <source.metal>...): generates <output> (to
# be included after the sources by one of <target>'s files) and puts its directory on
# <target>'s include path.
function(rnncore_emulator_signatures target output)
  set(check ${PROJECT_SOURCE_DIR}/cpp/shaders/check)
  file(GLOB headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cpp/shaders/*.h)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${Python3_EXECUTABLE} ${check}/emulator_signatures.py --cxx ${CMAKE_CXX_COMPILER}
            --output ${output} ${ARGN}
    DEPENDS ${check}/emulator_signatures.py ${check}/msl_source.py ${check}/include/metal_stdlib
            ${check}/include/project_macros.h
            ${headers} ${ARGN}
    COMMENT "Reading the signatures of ${target}'s Metal kernels for the emulator"
    VERBATIM)
  target_sources(${target} PRIVATE ${output})
  get_filename_component(dir ${output} DIRECTORY)
  target_include_directories(${target} PRIVATE ${dir})
endfunction()
