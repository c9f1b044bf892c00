# Linux aarch64 from an x86_64 Debian or Ubuntu host: the distribution's cross GCC
# (g++-aarch64-linux-gnu), arm64 OpenBLAS and GoogleTest through multiarch
# (libopenblas-dev:arm64, libgtest-dev:arm64), and the tests run under qemu user-mode
# (qemu-user). .ci/aarch64 uses it:
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# OpenBLAS and GoogleTest are installed for both architectures: never the host's copies.
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
                      /usr/include/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake/GTest)
# Programs (the Python that generates the emulator's signatures) are the host's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# -L /: the multiarch arm64 glibc with its own loader. The cross toolchain's loader
# (/usr/aarch64-linux-gnu) beside the multiarch libc.so.6 that OpenBLAS pulls in is a
# mismatched pair whose pthread_create never returns.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
