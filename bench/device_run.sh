#!/usr/bin/env bash
# The one device call (see bench/device_bench.py). Before it, here: bash bench/fetch_device_wheels.sh
# (transformers 5.23, PyAV, pyzmq, Ultralytics, lap for Python 3.12 into .whl/). Then the call:
#   run(command="bash bench/device_run.sh", carry=[".whl"], timeout_s=570)
# Time: everything below, the wheel install included, runs under one limit of LIMIT_S=540 s;
# device_bench.py gets --budget-s 510 (less when the install was slow, so that its budget plus
# ~25 s for its watchdog and shutdown still ends inside the 540 s): its DEFAULT phases. The device
# call's 570 s leave 30 s beyond that; with the machine's start (~1 min) one call costs about 10.5
# of the session's 15 minutes of device time. What failed, or the other phases (RERUNS in
# bench/device_bench.py), in a rerun while the machine is warm (timeout_s=250):
#   LIMIT_S=230 BUDGET_S=200 bash bench/device_run.sh --phases e2e_more
# Results land in $OUT: device_bench.md (the report, versions included), device_bench.json (every
# number), device_bench.log (stdout + stderr: tracebacks of failed phases, the watchdog's dumps of
# every thread of a phase that overran), gpu.txt (the GPU, its driver, and the image's torch).
# The bench runs on the device image's own torch, torchvision and triton (its python3): no carried
# wheel may replace them (the carried packages are installed with --no-deps). A rerun of what
# failed fits the session too: add --phases NAME,... (checkpoints are rebuilt first, ~25 s).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 YOLO_OFFLINE=1
# Ultralytics' settings, Inductor's caches and ours in folders of this run, never in the home.
export YOLO_CONFIG_DIR=/tmp/device_run/yolo SAPIENS2_STREAM_CACHE=/tmp/device_run/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/device_run/inductor
OUT=${OUT:-/tmp/out}
LIMIT_S=${LIMIT_S:-540}
BUDGET_S=${BUDGET_S:-510}
SECONDS=0
mkdir -p "$OUT"
LOG="$OUT/device_bench.log"
: > "$LOG"
for wheel in .whl/torch-*.whl .whl/torchvision-*.whl .whl/triton-*.whl; do
  [ -e "$wheel" ] && { echo "error: $wheel would replace the device image's own torch stack" | tee -a "$LOG" >&2; exit 1; }
done
if compgen -G ".whl/*.whl" > /dev/null; then
  timeout -k 5 "$LIMIT_S" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "error: installing the carried wheels failed" | tee -a "$LOG" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD:$PWD/clients/python
else
  echo "warning: no .whl/ carried: the reference, publisher and detector phases will fail" | tee -a "$LOG" >&2
  export PYTHONPATH=$PWD:$PWD/clients/python
fi
echo "wheels installed in ${SECONDS} s" | tee -a "$LOG"
# compute_mode: the e2e and starts phases run the command in processes of their own beside the worker's
# CUDA context, which an Exclusive_Process GPU refuses (their rows then fail with "busy or unavailable").
timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader \
  | tee "$OUT/gpu.txt" || true
# The image's torch (what every phase runs on; the report's versions table says it again).
timeout 60 python3 -c 'import sys, torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "at",
torch.__file__, "on Python", sys.version.split()[0])' 2>&1 | tee -a "$OUT/gpu.txt" "$LOG"
LEFT=$((LIMIT_S - SECONDS))
BUDGET=$((LEFT - 25 < BUDGET_S ? LEFT - 25 : BUDGET_S))
if [ "$BUDGET" -lt 60 ]; then
  echo "error: only ${LEFT} s of the ${LIMIT_S} s limit left after the install" | tee -a "$LOG" >&2
  exit 1
fi
echo "device_bench: budget ${BUDGET} s, hard limit ${LEFT} s" | tee -a "$LOG"
# timeout signals the whole process group: the bench's worker processes end with it.
timeout -k 10 "$LEFT" python3 -m bench.device_bench --out "$OUT" --budget-s "$BUDGET" "$@" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
