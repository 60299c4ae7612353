#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh - the install test: installs the build tree CTest is testing into a
# temporary prefix, then builds and runs a small outside program against it
# four ways: find_package with tollgate::tollgate and tollgate::tollgate_static
# (consumer/CMakeLists.txt), and pkg-config with cc, shared and static. It also
# checks the installed pkg-config file (version, prefix) and the installed
# `tollgate` program, `tollgate bench` included. Registered by tests/install/CMakeLists.txt, which passes:
#
#   run.sh BUILD_DIR CMAKE_COMMAND GENERATOR C_COMPILER LIBDIR VERSION SANITIZE REDIS
#
# REDIS (ON/OFF) says whether the library has the Redis store. With it, the
# two static links are the point: libtollgate.a needs hiredis, and the package
# must bring it by name (hiredis::hiredis through tollgateConfig.cmake,
# Requires.private: hiredis in tollgate.pc), never by the build machine's path.
# The pkg-config commands are the ones the README gives.
#
# SANITIZE is the build's TG_SANITIZE (may be empty): a sanitized library can
# only be linked into a sanitized program, so the consumers get the same
# -fsanitize flags. The prefix is removed on success, kept on failure.
set -euo pipefail

build_dir=$1 cmake=$2 generator=$3 cc=$4 libdir=$5 version=$6 sanitize=${7:-}
redis=${8:-OFF}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-install.XXXXXX")
prefix=$work/prefix
trap 'rc=$?; if [ $rc = 0 ]; then rm -rf "$work"; else echo "install test: FAILED, files kept in $work" >&2; fi' EXIT

fail() {
  echo "install test: $*" >&2
  exit 1
}

sanflags=()
if [ -n "$sanitize" ]; then
  sanflags=("-fsanitize=$sanitize" -fno-omit-frame-pointer)
  echo "install test: sanitized build ($sanitize): consumers get ${sanflags[*]}"
fi

case $redis in
ON | on | TRUE | true | 1) redis=yes ;;
*) redis=no ;;
esac
expected="tollgate $version: 3 allowed, 1 denied, redis $redis"

# check_run NAME EXE SHARED: runs a consumer and compares its one line; SHARED
# (yes/no) says whether it must load libtollgate.so from the prefix or carry
# the library inside.
check_run() {
  local name=$1 exe=$2 shared=$3 out
  if command -v readelf >/dev/null 2>&1; then
    if readelf -d "$exe" | grep -q 'NEEDED.*\[libtollgate\.so'; then
      [ "$shared" = yes ] || fail "$name: links libtollgate.so, expected the static library"
    else
      [ "$shared" = no ] || fail "$name: does not link libtollgate.so"
    fi
  fi
  out=$(LD_LIBRARY_PATH="$prefix/$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe") ||
    fail "$name: exited with status $?"
  [ "$out" = "$expected" ] || fail "$name: printed '$out', expected '$expected'"
  echo "install test: $name: ok ($out)"
}

# 1. Install exactly what this build tree holds, with a relative --prefix
# (as a user may type it): tollgate.pc must still name it absolutely, or
# pkg-config from any other directory points at nothing.
(cd "$work" && "$cmake" --install "$build_dir" --prefix prefix) >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }
grep -qx "prefix=$prefix" "$prefix/$libdir/pkgconfig/tollgate.pc" ||
  fail "tollgate.pc does not name the prefix $prefix absolutely: $(grep '^prefix=' "$prefix/$libdir/pkgconfig/tollgate.pc")"
for f in "include/tollgate.h" "$libdir/libtollgate.a" "$libdir/libtollgate.so" \
  "$libdir/pkgconfig/tollgate.pc" "$libdir/cmake/tollgate/tollgateConfig.cmake" \
  "$libdir/cmake/tollgate/tollgateConfigVersion.cmake"; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
# The soname follows the ABI policy: MAJOR.MINOR before 1.0, MAJOR after.
if command -v readelf >/dev/null 2>&1; then
  major=${version%%.*}
  minor=${version#*.}
  minor=${minor%%.*}
  if [ "$major" = 0 ]; then want_soname="libtollgate.so.0.$minor"; else want_soname="libtollgate.so.$major"; fi
  soname=$(readelf -d "$prefix/$libdir/libtollgate.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ "$soname" = "$want_soname" ] || fail "libtollgate.so has soname '$soname', expected $want_soname"
fi
# The exported targets must not pin a library to where the build machine kept
# it: a consumer elsewhere would fail to link (or link something else).
if grep -nE '(^|[";( ])/[^";( ]*\.(so|a)(\.[0-9.]+)?([";)> ]|$)' "$prefix/$libdir/cmake/tollgate/"tollgateTargets*.cmake; then
  fail "the exported CMake targets name a library by absolute path (above)"
fi

# 2. find_package(tollgate): shared and static targets.
consumer_build=$work/consumer-build
cmake_args=(-S "$here/consumer" -B "$consumer_build" -G "$generator"
  "-DCMAKE_C_COMPILER=$cc" "-DCMAKE_PREFIX_PATH=$prefix"
  "-DTG_EXPECT_PREFIX=$prefix" "-DTG_EXPECT_VERSION=$version"
  "-DTG_EXPECT_REDIS=$([ "$redis" = yes ] && echo ON || echo OFF)")
if [ -n "$sanitize" ]; then
  cmake_args+=("-DCMAKE_C_FLAGS=${sanflags[*]}" "-DCMAKE_EXE_LINKER_FLAGS=${sanflags[*]}")
fi
"$cmake" "${cmake_args[@]}" >"$work/consumer-configure.log" 2>&1 ||
  { cat "$work/consumer-configure.log" >&2; fail "configuring the find_package consumer failed"; }
"$cmake" --build "$consumer_build" >"$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log" >&2; fail "building the find_package consumers failed"; }
check_run "find_package tollgate::tollgate" "$consumer_build/consumer_shared" yes
check_run "find_package tollgate::tollgate_static" "$consumer_build/consumer_static" no

# 3. pkg-config, looking at this prefix first (its tollgate.pc shadows any
# system one) and then at the system's own directories, where hiredis.pc is.
command -v pkg-config >/dev/null 2>&1 || fail "pkg-config is not installed"
system_pc=$(pkg-config --variable pc_path pkg-config 2>/dev/null || true)
export PKG_CONFIG_LIBDIR="$prefix/$libdir/pkgconfig${system_pc:+:$system_pc}"
unset PKG_CONFIG_PATH
pc_file=$(pkg-config --path tollgate 2>/dev/null || echo "$prefix/$libdir/pkgconfig/tollgate.pc")
case $pc_file in
"$prefix"/*) ;;
*) fail "pkg-config found $pc_file, not the one under $prefix" ;;
esac
if [ "$redis" = yes ]; then
  if pkg-config --exists hiredis &&
    ! pkg-config --print-requires-private tollgate | grep -qx 'hiredis'; then
    fail "hiredis.pc exists but tollgate.pc does not name it in Requires.private"
  fi
  static_libs=$(pkg-config --static --libs tollgate)
  case " $static_libs " in
  *" -lhiredis "*) ;;
  *) fail "pkg-config --static --libs tollgate lacks -lhiredis: $static_libs" ;;
  esac
fi
pc_version=$(pkg-config --modversion tollgate)
[ "$pc_version" = "$version" ] || fail "tollgate.pc says version $pc_version, expected $version"
pc_prefix=$(pkg-config --variable=prefix tollgate)
[ "$pc_prefix" = "$prefix" ] || fail "tollgate.pc says prefix=$pc_prefix, expected $prefix"
read -r -a pc_cflags <<<"$(pkg-config --cflags tollgate)"
read -r -a pc_libs <<<"$(pkg-config --libs tollgate)"
warn=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

"$cc" "${warn[@]}" "${sanflags[@]}" "${pc_cflags[@]}" "$here/consumer/consumer.c" \
  -o "$work/pc_shared" "${pc_libs[@]}" || fail "cc with pkg-config --cflags --libs failed"
check_run "pkg-config shared" "$work/pc_shared" yes

# Static: --static adds Libs.private and the Requires.private modules
# (hiredis); -l:libtollgate.a picks the archive even though libtollgate.so sits
# beside it. This is the README's static command, word for word but for the
# warning, sanitizer and consumer flags.
# shellcheck disable=SC2046 # word splitting of pkg-config's output is meant
"$cc" "${warn[@]}" "${sanflags[@]}" -DCONSUMER_STATIC -DTG_STATIC "$here/consumer/consumer.c" \
  -o "$work/pc_static" $(pkg-config --static --cflags --libs tollgate | sed 's/-ltollgate\b/-l:libtollgate.a/') ||
  fail "cc with pkg-config --static --cflags --libs failed"
check_run "pkg-config static" "$work/pc_static" no

# 4. The installed command-line program, if the build has it.
if [ -x "$prefix/bin/tollgate" ]; then
  out=$("$prefix/bin/tollgate" version) || fail "installed tollgate version: status $?"
  case $out in
  *"$version"*) echo "install test: bin/tollgate: ok ($out)" ;;
  *) fail "installed tollgate version printed '$out', expected $version" ;;
  esac
fi

# 5. `tollgate bench` from the install: it must find the installed
# tollgate_bench by itself (not the build tree's, not one on PATH).
if [ -x "$prefix/bin/tollgate" ] && [ -x "$prefix/libexec/tollgate/tollgate_bench" ]; then
  out=$(env -u TOLLGATE_BENCH PATH=/usr/bin:/bin "$prefix/bin/tollgate" bench --quick --filter name=clock_read_coarse 2>&1) ||
    { echo "$out" >&2; fail "installed tollgate bench: status $?"; }
  case $out in
  *"name=clock_read_coarse"*) echo "install test: bin/tollgate bench: ok" ;;
  *) echo "$out" >&2; fail "installed tollgate bench printed no clock_read_coarse line" ;;
  esac
elif [ -x "$prefix/bin/tollgate" ] && [ -d "$build_dir/bench" ]; then
  fail "the build has the benchmarks but libexec/tollgate/tollgate_bench was not installed"
fi

echo "install test: all consumers built and ran against $prefix"
