#!/usr/bin/env bash
# The one device call (see bench/device_bench.py). On the GPU machine, from the repo root:
#   bash bench/device_run.sh            (with .whl carried; results land in $OUT)
# Before the call, here: bash bench/fetch_device_wheels.sh   (downloads the wheels into .whl/)
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 YOLO_OFFLINE=1
OUT=${OUT:-/tmp/out}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt" || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout 540 python3 bench/device_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/device_bench.log"
