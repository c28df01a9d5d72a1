#!/usr/bin/env bash
# Wheels the GPU machine lacks (Python 3.12, x86-64), into .whl/ (ignored by git, carried by the
# device call): transformers 5.23 for the reference path, PyAV, pyzmq, msgpack (wire format).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
for pkg in transformers==5.23.0 av pyzmq msgpack; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$pkg"
done
ls -la .whl
