#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# exports.sh - checks the shared library's dynamic symbol table: it must export
# exactly the functions tollgate.h declares TG_EXTERN, and nothing internal
# (tg__*, helpers, file-statics made extern by mistake). Sanitizer runtime
# hooks that instrumented builds add (__asan_*, __odr_asan*, ...) are ignored.
# Registered by tests/install/CMakeLists.txt:  exports.sh NM LIBTOLLGATE.so HEADER
set -euo pipefail

nm=$1 lib=$2 header=$3

exported=$("$nm" -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' |
  grep -Ev '^(__(asan|odr_asan|ubsan|tsan|lsan|sanitizer|sancov)|_init$|_fini$|_edata$|_end$|__bss_start$)' |
  sort -u || true)
declared=$(grep -E '^[[:space:]]*TG_EXTERN[[:space:]]' "$header" |
  sed -nE 's/.*[^A-Za-z0-9_](tg_[a-z0-9_]+)[[:space:]]*\(.*/\1/p' | sort -u)

[ -n "$declared" ] || { echo "exports: found no TG_EXTERN declarations in $header" >&2; exit 1; }

status=0
internal=$(grep -Ev '^tg_[a-z0-9]' <<<"$exported" || true)
if [ -n "$internal" ]; then
  echo "exports: $lib exports symbols that are not public tg_* API:" >&2
  sed 's/^/  /' <<<"$internal" >&2
  status=1
fi
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
  echo "exports: declared TG_EXTERN in $header but not exported:" >&2
  sed 's/^/  /' <<<"$missing" >&2
  status=1
fi
undeclared=$(comm -13 <(echo "$declared") <(grep -E '^tg_[a-z0-9]' <<<"$exported" || true))
if [ -n "$undeclared" ]; then
  echo "exports: exported but not declared TG_EXTERN in $header:" >&2
  sed 's/^/  /' <<<"$undeclared" >&2
  status=1
fi
[ $status = 0 ] && echo "exports: $(wc -l <<<"$declared") public tg_* functions exported, nothing else"
exit $status
