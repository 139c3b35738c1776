# Cross-compiling lowbit for aarch64 Linux with Debian's cross compilers
# (g++-aarch64-linux-gnu, gcc-aarch64-linux-gnu) and running its tests under
# qemu-user: scripts/test_arm.sh configures with this file.
#
# Headers and libraries of the target come from Debian's multiarch arm64
# packages (libcmocka-dev:arm64 installs into /usr/lib/aarch64-linux-gnu) and
# the cross compiler's own runtime (/usr/aarch64-linux-gnu). CTest runs every
# test command through CMAKE_CROSSCOMPILING_EMULATOR: qemu-aarch64-static (or
# qemu-aarch64) with -cpu max, so NEON and SVE code paths both execute.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Target files only: the cross runtime, then the root (where multiarch puts
# /usr/lib/aarch64-linux-gnu and /usr/include/aarch64-linux-gnu); programs
# (pkg-config, bash) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config reads the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

if(NOT DEFINED LOWBIT_QEMU_AARCH64)
  find_program(LOWBIT_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
endif()
if(LOWBIT_QEMU_AARCH64)
  # The arm64 loader and libraries are those of Debian's multiarch packages
  # (libc6:arm64 and friends, installed by scripts/test_arm.sh): no -L prefix.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${LOWBIT_QEMU_AARCH64} -cpu max)
endif()
