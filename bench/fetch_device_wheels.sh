#!/usr/bin/env bash
# Wheels the GPU machine lacks (Python 3.12, x86-64), into .whl/ (ignored by git, carried by the
# device call): transformers 5.23 for the reference path, PyAV (recording, codecs), pyzmq
# (publisher), Ultralytics + lap (the person detector). The versions are the ones the tests here
# run with. The machine already has numpy, opencv-headless, msgpack, scipy, matplotlib, pillow,
# psutil, pyyaml, safetensors, tokenizers, huggingface-hub and torch/torchvision (see
# /work/.library/device/KINDS.md). About 54 MB, under the 64 MiB a call carries with the working
# tree. Then: run(command="bash bench/device_run.sh", carry=[".whl"], timeout_s=570)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git check-ignore -q .whl/ 2>/dev/null; then  # .gitignore has it; else the repo's own exclude file
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")" && echo '/.whl/' >> "$exclude"
fi
rm -rf .whl && mkdir -p .whl
for pkg in transformers==5.23.0 av==18.1.0 pyzmq==27.3.0 ultralytics==8.4.190 lap==0.5.13; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$pkg"
done
du -sh .whl && ls .whl
