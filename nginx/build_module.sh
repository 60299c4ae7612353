#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# build_module.sh NGINX_SRC BUILD_DIR MODULE_DIR INCLUDE_DIR LIBS CC OUT
#
# Builds ngx_http_tollgate_module.so the way Debian builds its own nginx
# modules (dh_nginx's nginx_mod build system): nginx's ./configure, with the
# distribution's configure flags (NGINX_SRC/conf_flags, which nginx-dev
# installs beside the source tree), plus --add-dynamic-module, then
# `make modules`. A dynamic module must be built with the same flags as the
# nginx that loads it (--with-compat included): nginx checks a signature of
# them at load_module and refuses a module built otherwise.
#
# The tree is copied into BUILD_DIR first: ./configure writes its Makefile
# into the tree it runs in, and the installed one belongs to the package.
# configure runs again only when the copy is missing or this script, the
# module's `config` or the library flags changed.
#
# The build directory is given to configure relative to the tree (../objs):
# configure derives each object's path from it with sed rules for source
# suffixes that also match inside a directory name (a checkout under
# /tmp/tmp.S1x2... had ".S" rewritten to ".o", and make found no rule for
# the mangled paths). A relative path keeps the checkout's name out of them.
set -euo pipefail
src=$1 build=$2 module=$3 include=$4 libs=$5 cc=$6 out=$7

tree=$build/nginx-src
stamp=$build/configured
want="$(sha1sum "$module/config" "$0" | sha1sum) $include $libs $cc"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  rm -rf "$tree" "$build/objs"
  mkdir -p "$build"
  cp -a "$src" "$tree"
  # shellcheck disable=SC1091
  . "$tree/conf_flags"
  (cd "$tree" &&
    TG_NGX_INCLUDE=$include TG_NGX_LIBS=$libs CC=$cc \
      ./configure \
      --with-cc-opt="-g -O2 -fstack-protector-strong -Wformat -Werror=format-security -fPIC -D_FORTIFY_SOURCE=2" \
      --with-ld-opt="-Wl,-z,relro -Wl,-z,now -fPIC" \
      "${NGX_CONF_FLAGS[@]}" \
      --add-dynamic-module="$module" \
      --builddir=../objs) >"$build/configure.log" 2>&1 ||
    { tail -30 "$build/configure.log" >&2; exit 1; }
  echo "$want" >"$stamp"
fi
unset MAKEFLAGS MFLAGS MAKELEVEL
# nginx's Makefile knows the module's own sources, not the library it links
# (TG_NGX_LIBS): CMake runs this script when either changed, so the module
# is linked again every time, or a changed library would never reach it
rm -f "$build/objs/ngx_http_tollgate_module.so"
make -s -f "$build/objs/Makefile" -C "$tree" modules
cp "$build/objs/ngx_http_tollgate_module.so" "$out"
