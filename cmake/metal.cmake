# The Metal backend (Apple only; see shared/design/architecture.md, "Metal backend"):
# metal-cpp, the kernels compiled into one rnncore.metallib embedded in the library, and the
# metal-cpp executor. Included by CMakeLists.txt when the Metal backend is enabled.
include(FetchContent)

function(rnncore_add_metal target)
  # metal-cpp is header-only. Pinned to the commit of the tag
  # release/metal-cpp_macOS26.4_iOS26.4; offline builds can point
  # FETCHCONTENT_SOURCE_DIR_METAL_CPP at a checkout of it.
  FetchContent_Declare(metal_cpp
    GIT_REPOSITORY https://github.com/apple/metal-cpp.git
    GIT_TAG c595afef4a5dc388f4047cd0c69f9e7f9468d9ed)
  FetchContent_MakeAvailable(metal_cpp)
  # SYSTEM: metal-cpp's headers are not -Wpedantic clean, and tests build with -Werror.
  target_include_directories(${target} SYSTEM PRIVATE ${metal_cpp_SOURCE_DIR})

  # ---- Kernels: every .metal file -> .air -> rnncore.metallib --------------------------------
  find_program(RNNCORE_XCRUN xcrun REQUIRED)
  execute_process(COMMAND ${RNNCORE_XCRUN} -sdk macosx -f metal
                  RESULT_VARIABLE metal_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT metal_rc EQUAL 0)
    message(FATAL_ERROR "The Metal backend needs the Metal compiler (xcrun metal), which comes "
                        "with Xcode; install it or configure with -DRNNCORE_METAL=OFF")
  endif()
  # -std=metal3.0 needs macOS 13; an older deployment target still gets a 13.0 library (its
  # load fails cleanly with a DeviceError on older systems).
  set(metal_min_macos 13.0)
  if(CMAKE_OSX_DEPLOYMENT_TARGET AND CMAKE_OSX_DEPLOYMENT_TARGET VERSION_GREATER 13.0)
    set(metal_min_macos ${CMAKE_OSX_DEPLOYMENT_TARGET})
  endif()

  set(shader_dir ${PROJECT_SOURCE_DIR}/cpp/shaders)
  file(GLOB shader_sources CONFIGURE_DEPENDS ${shader_dir}/*.metal)
  file(GLOB shader_headers CONFIGURE_DEPENDS ${shader_dir}/*.h)
  if(NOT shader_sources)
    message(FATAL_ERROR "No Metal kernels found in ${shader_dir}")
  endif()
  set(air_dir ${CMAKE_CURRENT_BINARY_DIR}/metal)
  file(MAKE_DIRECTORY ${air_dir})
  set(air_files)
  foreach(source IN LISTS shader_sources)
    get_filename_component(stem ${source} NAME_WE)
    set(air ${air_dir}/${stem}.air)
    # No fast math: the sigmoid/tanh-heavy kernels are compared to the CPU backend.
    add_custom_command(OUTPUT ${air}
      COMMAND ${RNNCORE_XCRUN} -sdk macosx metal -c -std=metal3.0 -Wall -Wextra -Werror -Wno-unused-parameter
              -fno-fast-math -mmacosx-version-min=${metal_min_macos} -I ${shader_dir}
              ${source} -o ${air}
      DEPENDS ${source} ${shader_headers}
      COMMENT "Compiling Metal kernels ${stem}.metal"
      VERBATIM)
    list(APPEND air_files ${air})
  endforeach()

  # Kept in the build tree: RNNCORE_METALLIB=<this file> loads it instead of the embedded copy.
  set(metallib ${CMAKE_CURRENT_BINARY_DIR}/rnncore.metallib)
  add_custom_command(OUTPUT ${metallib}
    COMMAND ${RNNCORE_XCRUN} -sdk macosx metallib ${air_files} -o ${metallib}
    DEPENDS ${air_files}
    COMMENT "Linking rnncore.metallib"
    VERBATIM)

  set(embedded ${CMAKE_CURRENT_BINARY_DIR}/rnncore_metallib.cpp)
  add_custom_command(OUTPUT ${embedded}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${metallib} -DOUTPUT=${embedded} -DNAME=rnncore_metallib
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_file.cmake
    DEPENDS ${metallib} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_file.cmake
    COMMENT "Embedding rnncore.metallib"
    VERBATIM)

  target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cpp/src/metal/apple_executor.cpp
                                   ${embedded})

  # ---- Frameworks ---------------------------------------------------------------------------
  find_library(RNNCORE_METAL_FRAMEWORK Metal REQUIRED)
  find_library(RNNCORE_FOUNDATION_FRAMEWORK Foundation REQUIRED)
  target_link_libraries(${target}
    PRIVATE $<BUILD_INTERFACE:${RNNCORE_METAL_FRAMEWORK}>
            $<BUILD_INTERFACE:${RNNCORE_FOUNDATION_FRAMEWORK}>)
  # Consumers of the installed static library link the same frameworks.
  target_link_libraries(${target}
    INTERFACE "$<INSTALL_INTERFACE:-framework Metal>" "$<INSTALL_INTERFACE:-framework Foundation>")
endfunction()
