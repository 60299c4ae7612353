#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_python.sh SCRIPT ARGS... - runs a Python test with a python3 that can
# import Debian's python3-redis (/usr/bin/python3 first: a python3 earlier
# on PATH, e.g. a pyenv one, does not see Debian's packages). Fails with a
# clear message when there is none, rather than skipping.
for py in /usr/bin/python3 python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import redis' 2>/dev/null; then
    exec "$py" "$@"
  fi
done
echo "FAIL: no python3 with the redis module (Debian: apt-get install python3-redis)" >&2
exit 1
