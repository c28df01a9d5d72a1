#!/usr/bin/env bash
# The one device call (see bench/device_bench.py). Before it, here: bash bench/fetch_device_wheels.sh
# (transformers 5.23, PyAV, pyzmq, Ultralytics, lap for Python 3.12 into .whl/). Then the call:
#   run(command="bash bench/device_run.sh", carry=[".whl"], timeout_s=580)
# Results land in $OUT: device_bench.md (the report), device_bench.json (every number),
# device_bench.log (stdout + stderr, tracebacks of failed phases), gpu.txt, versions.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 YOLO_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  echo "warning: no .whl/ carried: the reference, publisher and detector phases will fail" >&2
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt" || true
python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import importlib
for name in ("torch", "torchvision", "transformers", "av", "zmq", "ultralytics", "cv2", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # report, do not stop: the phases that need it will say so
        print(name, "MISSING", type(exc).__name__, exc)
PY
timeout 510 python3 bench/device_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/device_bench.log"
exit "${PIPESTATUS[0]}"
