#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test.sh - configure, build and run the whole test suite: the one command to
# type after cloning.
#
#   ./scripts/test.sh                 the debug preset (gcc or cc, -Werror)
#   ./scripts/test.sh asan tsan       several presets in turn: debug, release,
#                                     asan (ASan+UBSan), tsan, clang
#   ./scripts/test.sh -L unit         only the tests with a label (a CTest
#                                     regex); -E slow leaves a label out.
#                                     Labels: docs/DESIGN.md, "Tests".
#
# Each preset is a CMake workflow (CMakePresets.json): configure into
# build/<preset>, build, run CTest with output on failure. First it makes sure
# the build dependencies are there (cmake >= 3.25, a C compiler, pkg-config,
# cmocka, hiredis, libuv; redis-server, redis-cli and python3's redis module
# for the tests that talk to a private Redis server); when one is missing it installs
# it with apt-get if it runs as root
# on Debian/Ubuntu, and otherwise says what to install and stops.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

presets=()
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
  -L | -E)
    [ $# -ge 2 ] || { echo "test.sh: $1 wants a label" >&2; exit 2; }
    [ "$1" = -L ] && ctest_args+=(-L "$2") || ctest_args+=(-LE "$2")
    shift 2
    ;;
  -*)
    echo "test.sh: unknown option $1 (presets, -L LABEL, -E LABEL)" >&2
    exit 2
    ;;
  *)
    presets+=("$1")
    shift
    ;;
  esac
done
[ ${#presets[@]} -gt 0 ] || presets=(debug)

# Debian package for each missing dependency.
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists cmocka; then
  missing+=(libcmocka-dev)
fi
[ -f /usr/include/hiredis/hiredis.h ] || missing+=(libhiredis-dev)
# libuv: the non-blocking API's example adapter and its test
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libuv; then
  missing+=(libuv1-dev)
fi
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v curl >/dev/null 2>&1 || missing+=(curl) # the HTTP example's test
# (the system python: a python3 earlier on PATH, e.g. pyenv's, lacks Debian's)
{ python3 -c 'import redis' || /usr/bin/python3 -c 'import redis'; } >/dev/null 2>&1 ||
  missing+=(python3-redis)
for p in "${presets[@]}"; do
  [ "$p" != clang ] || command -v clang >/dev/null 2>&1 || missing+=(clang)
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "test.sh: missing build dependencies. On Debian/Ubuntu:" >&2
    echo "  sudo apt-get install ${missing[*]}" >&2
    echo "(elsewhere: CMake >= 3.25, a C11 compiler, pkg-config, cmocka, hiredis," \
      "libuv, redis-server with redis-cli, and the redis module for python3)" >&2
    exit 1
  fi
fi

cmake_version=$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
if ! printf '3.25\n%s\n' "$cmake_version" | sort -V -C; then
  echo "test.sh: CMake $cmake_version is too old: the presets need 3.25 or newer" >&2
  exit 1
fi

# The nginx module (nginx/) is built and tested only where Debian's nginx-dev
# is installed; it is optional, so its absence is said, not installed.
if [ ! -f /usr/share/nginx/src/conf_flags ] ||
  { ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; }; then
  echo "test.sh: nginx and nginx-dev are not installed: the nginx module and its" \
    "tests are skipped (Debian: apt-get install nginx nginx-dev)"
fi

# Build with every core unless the caller chose a level.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}

for p in "${presets[@]}"; do
  echo "=== test.sh: preset $p"
  if [ ${#ctest_args[@]} -eq 0 ] || [ "$p" = release ]; then
    cmake --workflow --preset "$p"
  else # the workflow's steps, with a label filter on the test step
    cmake --preset "$p"
    cmake --build --preset "$p"
    ctest --preset "$p" "${ctest_args[@]}"
  fi
done
