# The Metal backend (Apple silicon only):
# metal-cpp, the kernels compiled into two metallibs embedded in the library (rnncore.metallib
# for macOS 13, and one with the bfloat16 kernels for macOS 14 and later), and the metal-cpp
# executor. Included by CMakeLists.txt, which calls rnncore_metal_enabled() to decide
# and rnncore_add_metal() to build it. tests/apple_host exercises both on Linux, with a
# stand-in xcrun and stand-ins for the SDK headers.

set(RNNCORE_METAL_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

# How to get the Metal compiler: said by the AUTO warning, the ON error and, in a library
# built without it, by the DeviceError for device 'metal' (cpp/src/metal/devices.cpp).
# (No semicolons: it becomes a compile definition.)
string(CONCAT RNNCORE_METAL_COMPILER_HELP
  "install Xcode (the Command Line Tools alone have no Metal compiler), select it with "
  "sudo xcode-select -s /Applications/Xcode.app and, with Xcode 26 or later, download its "
  "Metal toolchain with xcodebuild -downloadComponent MetalToolchain. Check that "
  "xcrun -sdk macosx metal --version runs, then reinstall rnncore "
  "(pip install --no-cache-dir --force-reinstall .)")

# Whether the Metal backend is built. Sets <out> to TRUE or FALSE and <reason_out> to why it
# is off ("" when on), in the caller's scope.
#   mode   RNNCORE_METAL: AUTO (on for Apple when the Metal compiler runs), ON, OFF
#   apple  whether the target is Apple
# The Metal compiler must run: `xcrun -sdk macosx metal --version`. (Since Xcode 26 the
# compiler is a separately downloaded component and `xcrun -f metal` finds a stub without it,
# so finding the tool proves nothing.) Without it AUTO builds the CPU-only library with a
# warning that says how to get the compiler; only ON stops. RNNCORE_XCRUN names the xcrun to
# use (found on PATH when unset).
function(rnncore_metal_enabled mode apple out reason_out)
  string(TOUPPER "${mode}" mode)
  if(mode STREQUAL "AUTO")
    if(NOT apple)
      set(${out} FALSE PARENT_SCOPE)
      set(${reason_out} "" PARENT_SCOPE)  # the default: Metal is for Apple silicon Macs
      return()
    endif()
    set(required FALSE)
  elseif(mode)
    set(required TRUE)
  else()
    set(${out} FALSE PARENT_SCOPE)
    set(${reason_out} "it was configured with RNNCORE_METAL=OFF" PARENT_SCOPE)
    return()
  endif()

  if(NOT RNNCORE_XCRUN)
    find_program(RNNCORE_XCRUN xcrun)
  endif()
  set(problem "")
  if(NOT RNNCORE_XCRUN)
    set(problem "xcrun was not found")
  else()
    execute_process(COMMAND ${RNNCORE_XCRUN} -sdk macosx metal --version
                    RESULT_VARIABLE rc OUTPUT_VARIABLE version ERROR_VARIABLE error
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      string(REGEX REPLACE "\n.*" "" error "${error}")
      set(problem "`xcrun -sdk macosx metal --version` failed (${rc}): ${error}")
    else()
      string(REGEX REPLACE "\n.*" "" version "${version}")
      message(STATUS "rnncore: Metal compiler: ${version}")
    endif()
  endif()

  if(problem STREQUAL "")
    set(${out} TRUE PARENT_SCOPE)
    set(${reason_out} "" PARENT_SCOPE)
  elseif(required)
    message(FATAL_ERROR "RNNCORE_METAL=ON but the Metal compiler does not run: ${problem}. "
                        "To build the Metal backend, ${RNNCORE_METAL_COMPILER_HELP}. Or configure "
                        "with RNNCORE_METAL=AUTO or OFF to build without it.")
  else()
    message(WARNING "rnncore: building WITHOUT the Metal backend (CPU only): the Metal compiler "
                    "does not run: ${problem}. rnncore.devices() will not list 'metal'. To get "
                    "the Metal backend, ${RNNCORE_METAL_COMPILER_HELP}. Configure with "
                    "RNNCORE_METAL=OFF to build the CPU-only library without this warning, or ON "
                    "to make a missing Metal compiler an error.")
    set(${out} FALSE PARENT_SCOPE)
    # One string without semicolons: it becomes a compile definition.
    set(${reason_out}
        "it was built without the Metal compiler. To get it, ${RNNCORE_METAL_COMPILER_HELP}"
        PARENT_SCOPE)
  endif()
endfunction()

# Adds the stand-in for the Metal backend to <target>, for builds without it: device 'metal'
# raises a DeviceError naming <reason> (why this build has no Metal backend; "" for the
# default: Metal is for Apple silicon Macs).
function(rnncore_add_no_metal target reason)
  get_filename_component(source ${RNNCORE_METAL_CMAKE_DIR}/../cpp/src/metal/devices.cpp
                         ABSOLUTE)
  target_sources(${target} PRIVATE ${source})
  if(reason)
    set_source_files_properties(${source} PROPERTIES COMPILE_DEFINITIONS
      "RNNCORE_NO_METAL_REASON=\"${reason}\"")
  endif()
endfunction()

# Compiles every .metal file of shader_dir (rnncore_add_metal's shader_sources, rebuilt when
# a shader_headers file changes) with -std=<metal_std> for macOS <min_macos> (or the
# deployment target if later), links them into <name>.metallib in the build tree and embeds
# that as the symbols <symbol> and <symbol>_size (embed_file.cmake). Sets <out> to the
# embedding source, in the caller's scope.
function(rnncore_add_metallib name metal_std min_macos symbol out)
  if(CMAKE_OSX_DEPLOYMENT_TARGET AND CMAKE_OSX_DEPLOYMENT_TARGET VERSION_GREATER min_macos)
    set(min_macos ${CMAKE_OSX_DEPLOYMENT_TARGET})
  endif()
  # A directory per library: both compile the same stems.
  set(air_dir ${CMAKE_CURRENT_BINARY_DIR}/metal/${name})
  file(MAKE_DIRECTORY ${air_dir})
  set(air_files)
  foreach(source IN LISTS shader_sources)
    get_filename_component(stem ${source} NAME_WE)
    set(air ${air_dir}/${stem}.air)
    # No fast math: the sigmoid/tanh-heavy kernels are compared to the CPU backend.
    add_custom_command(OUTPUT ${air}
      COMMAND ${RNNCORE_XCRUN} -sdk macosx metal -c -std=${metal_std} -Wall -Wextra -Werror
              -Wno-unused-parameter -fno-fast-math -mmacosx-version-min=${min_macos}
              -I ${shader_dir} ${source} -o ${air}
      DEPENDS ${source} ${shader_headers}
      COMMENT "Compiling Metal kernels ${stem}.metal (${metal_std})"
      VERBATIM)
    list(APPEND air_files ${air})
  endforeach()

  # Kept in the build tree: RNNCORE_METALLIB=<this file> loads it instead of the embedded ones.
  set(metallib ${CMAKE_CURRENT_BINARY_DIR}/${name}.metallib)
  add_custom_command(OUTPUT ${metallib}
    COMMAND ${RNNCORE_XCRUN} -sdk macosx metallib ${air_files} -o ${metallib}
    DEPENDS ${air_files}
    COMMENT "Linking ${name}.metallib"
    VERBATIM)

  set(embedded ${CMAKE_CURRENT_BINARY_DIR}/${symbol}.cpp)
  add_custom_command(OUTPUT ${embedded}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${metallib} -DOUTPUT=${embedded} -DNAME=${symbol}
            -P ${RNNCORE_METAL_CMAKE_DIR}/embed_file.cmake
    DEPENDS ${metallib} ${RNNCORE_METAL_CMAKE_DIR}/embed_file.cmake
    COMMENT "Embedding ${name}.metallib"
    VERBATIM)
  set(${out} ${embedded} PARENT_SCOPE)
endfunction()

# Adds the Metal backend to <target>: the kernels (.metal -> .air -> the two metallibs,
# embedded), the metal-cpp executor, the frameworks.
function(rnncore_add_metal target)
  include(FetchContent)
  # metal-cpp is header-only. Pinned to the commit of the tag
  # release/metal-cpp_macOS26.4_iOS26.4; offline builds can point
  # FETCHCONTENT_SOURCE_DIR_METAL_CPP at a checkout of it.
  FetchContent_Declare(metal_cpp
    GIT_REPOSITORY https://github.com/apple/metal-cpp.git
    GIT_TAG c595afef4a5dc388f4047cd0c69f9e7f9468d9ed)
  FetchContent_MakeAvailable(metal_cpp)

  # ---- Kernels: every .metal file -> .air -> two metallibs, both embedded --------------------
  # rnncore_metal_enabled() has checked that the compiler runs. Two libraries of the same
  # sources: rnncore.metallib (-std=metal3.0, loads on macOS 13) and the macOS 14 library
  # (-std=metal3.1, whose bfloat type adds the bfloat16-storage kernels; the compiler refuses
  # metal3.1 below macOS 14). The executor loads the macOS 14 one where the OS runs it.
  # An older deployment target still gets the 13.0 floor (the load fails cleanly with a
  # DeviceError on older systems); a newer one raises both floors.
  set(shader_dir ${PROJECT_SOURCE_DIR}/cpp/shaders)
  file(GLOB shader_sources CONFIGURE_DEPENDS ${shader_dir}/*.metal)
  file(GLOB shader_headers CONFIGURE_DEPENDS ${shader_dir}/*.h)
  if(NOT shader_sources)
    message(FATAL_ERROR "No Metal kernels found in ${shader_dir}")
  endif()

  rnncore_add_metallib(rnncore metal3.0 13.0 rnncore_metallib embedded_macos13)
  rnncore_add_metallib(rnncore_macos14 metal3.1 14.0 rnncore_metallib_macos14 embedded_macos14)

  # ---- Host code: one object whose metal-cpp symbols are all local ------------------------
  # apple_executor.cpp defines metal-cpp's implementation (NS_/MTL_PRIVATE_IMPLEMENTATION:
  # ~1,900 class, selector and constant symbols, some of them exported whatever the visibility
  # macro says). In a static library those would clash with the same definitions in any C++
  # application that uses metal-cpp itself. So the executor and the embedded metallibs are
  # compiled as usual, combined into one relocatable object, and every global symbol in it
  # that is not rnncore's is made local (private_symbols.cmake); that object goes into the
  # library.
  add_library(rnncore_metal_host OBJECT ${PROJECT_SOURCE_DIR}/cpp/src/metal/apple_executor.cpp
                                        ${embedded_macos13}
                                        ${embedded_macos14})
  # SYSTEM: metal-cpp's headers are not -Wpedantic clean, and tests build with -Werror.
  target_include_directories(rnncore_metal_host SYSTEM PRIVATE ${metal_cpp_SOURCE_DIR})
  target_include_directories(rnncore_metal_host PRIVATE ${PROJECT_SOURCE_DIR}/cpp/include
                             ${PROJECT_SOURCE_DIR}/cpp/src ${PROJECT_SOURCE_DIR}/cpp/shaders)
  target_compile_options(rnncore_metal_host PRIVATE ${RNNCORE_WARNINGS})

  set(link_flags)
  if(APPLE)
    set(format MACHO)
    foreach(arch IN LISTS CMAKE_OSX_ARCHITECTURES)
      list(APPEND link_flags -arch ${arch})
    endforeach()
    if(CMAKE_OSX_DEPLOYMENT_TARGET)
      list(APPEND link_flags -mmacosx-version-min=${CMAKE_OSX_DEPLOYMENT_TARGET})
    endif()
  else()
    set(format ELF)  # the Linux check of this build (tests/apple_host)
  endif()
  string(JOIN "|" link_flags ${link_flags})
  set(host_object ${CMAKE_CURRENT_BINARY_DIR}/rnncore_metal_host${CMAKE_CXX_OUTPUT_EXTENSION})
  add_custom_command(OUTPUT ${host_object}
    COMMAND ${CMAKE_COMMAND} "-DOBJECTS=$<JOIN:$<TARGET_OBJECTS:rnncore_metal_host>,|>"
            -DOUTPUT=${host_object} -DFORMAT=${format} -DCXX=${CMAKE_CXX_COMPILER}
            "-DLINK_FLAGS=${link_flags}" -DNM=${CMAKE_NM} -DOBJCOPY=${CMAKE_OBJCOPY}
            -P ${RNNCORE_METAL_CMAKE_DIR}/private_symbols.cmake
    DEPENDS rnncore_metal_host $<TARGET_OBJECTS:rnncore_metal_host>
            ${RNNCORE_METAL_CMAKE_DIR}/private_symbols.cmake
    COMMENT "Making metal-cpp's symbols local to rnncore"
    VERBATIM)
  add_custom_target(rnncore_metal_private DEPENDS ${host_object})
  add_dependencies(${target} rnncore_metal_private)
  set_source_files_properties(${host_object} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_sources(${target} PRIVATE ${host_object})

  # ---- Frameworks ---------------------------------------------------------------------------
  # CoreGraphics: without it MTLCreateSystemDefaultDevice() can return nil in a command-line
  # process (python), whatever GPU the Mac has.
  find_library(RNNCORE_METAL_FRAMEWORK Metal REQUIRED)
  find_library(RNNCORE_FOUNDATION_FRAMEWORK Foundation REQUIRED)
  find_library(RNNCORE_COREGRAPHICS_FRAMEWORK CoreGraphics REQUIRED)
  target_link_libraries(${target}
    PRIVATE $<BUILD_INTERFACE:${RNNCORE_METAL_FRAMEWORK}>
            $<BUILD_INTERFACE:${RNNCORE_FOUNDATION_FRAMEWORK}>
            $<BUILD_INTERFACE:${RNNCORE_COREGRAPHICS_FRAMEWORK}>)
  # Consumers of the installed static library link the same frameworks.
  target_link_libraries(${target}
    INTERFACE "$<INSTALL_INTERFACE:-framework Metal>" "$<INSTALL_INTERFACE:-framework Foundation>"
              "$<INSTALL_INTERFACE:-framework CoreGraphics>")
endfunction()
