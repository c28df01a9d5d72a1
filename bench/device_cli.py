"""Device benchmark phase of what a user runs: the real command, ``python -m pipeline.cli.main``, on the
embedded demo clip with the real-size checkpoints of the checkpoints phase, its keypoint messages
read by a ZeroMQ subscriber in this process.

Rows: pose, seg, pose + seg; full-frame and the YOLO detector (random weights: its cost is real, its
boxes are not); 1 and 4 sources; a live-paced row (``--realtime``) for the latency a camera sees.
Per row: frames per second (keypoint messages received, first 10% dropped), capture -> receive
latency p50/p95 (a file source's frames wait in its 8-frame queue: the paced row is the camera's
figure), the warm-up seconds the run logged, the fast paths it switched off, its exit status.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.devicekit import REPO, Ctx
from bench.harness import percentile

ROWS = (  # label, tasks, detector flags, sources, extra flags
    ("pose, full frame", "pose", ["--detector", "full-frame"], 1, []),
    ("seg", "seg", [], 1, []),
    ("pose + seg, full frame", "pose,seg", ["--detector", "full-frame"], 1, []),
    ("pose + seg, YOLO11n", "pose,seg", ["--detector-model", "yolo11n.yaml"], 1, []),
    ("pose + seg, full frame, 4 sources", "pose,seg", ["--detector", "full-frame"], 4, []),
    ("pose, YOLO11n, 4 sources", "pose", ["--detector-model", "yolo11n.yaml"], 4, []),
    ("pose + seg, full frame, paced live (--realtime)", "pose,seg", ["--detector", "full-frame"], 1, ["--realtime"]),
)
SMOKE_ROWS = (0, 5)  # the CPU smoke run: one single-source and one many-source row, a few frames


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Receiver(threading.Thread):
    """Keypoint messages of a run: (receive ns, capture ns, source) per message."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(name="e2e-subscriber", daemon=True)
        self.endpoint, self.stop = endpoint, threading.Event()
        self.got: list[tuple[int, int, str]] = []

    def run(self) -> None:
        from sapiens2_client.subscriber import ReceiveTimeout, Subscriber

        with Subscriber(self.endpoint, ["keypoints"]) as sub:
            while not self.stop.is_set():
                try:
                    msg = sub.recv(timeout_s=0.2)
                except ReceiveTimeout:
                    continue
                self.got.append((time.time_ns(), msg.meta.capture_ns, msg.meta.source_id))


def _command(ctx: Ctx, tasks: str, detector: list[str], sources: int, extra: list[str], endpoint: str) -> list[str]:
    argv = [sys.executable, "-m", "pipeline.cli.main", "--device", str(ctx.device), "--no-progress", "--tasks", tasks,
            "--publish", endpoint, *detector, *extra]
    for task in tasks.split(","):
        argv += ["--checkpoint", f"{task}={ctx.ckpt(task)}"]
    argv += ["--source", "demo"] if sources == 1 else [a for i in range(sources) for a in ("--source", f"c{i}=demo")]
    if ctx.smoke:
        argv += ["--max-frames", "6", "--dtype", "float32"]
    return argv


def run_row(ctx: Ctx, label: str, argv: list[str], endpoint: str, env: dict[str, str], limit_s: float,
            sources: int) -> dict[str, Any]:
    receiver = _Receiver(endpoint)
    receiver.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=limit_s)
        rc, log = proc.returncode, proc.stderr + proc.stdout
    except subprocess.TimeoutExpired as exc:
        rc, log = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
    wall = time.monotonic() - t0
    time.sleep(0.3)  # the last messages in flight
    receiver.stop.set()
    receiver.join(5.0)
    got = receiver.got[len(receiver.got) // 10:]  # the first 10%: the pipeline's first steps
    latency = [(r - c) / 1e6 for r, c, _ in got]
    span = (got[-1][0] - got[0][0]) / 1e9 if len(got) > 1 else 0.0
    warm = re.search(r"warm-up ([\d.]+) s", log)
    done = re.search(r"done: (\d+) frames, ([\d.]+) fps", log)
    row = dict(label=label, rc=rc, wall_s=round(wall, 1), messages=len(receiver.got),
               fps_per_source=(len(got) - 1) / span / sources if span > 0 else None,
               p50_ms=percentile(latency, 50) if latency else None, p95_ms=percentile(latency, 95) if latency else None,
               warm_s=float(warm.group(1)) if warm else None,
               cli_fps=float(done.group(2)) if done else None,
               switched_off=re.findall(r"fast path (.+?) switched off", log),
               error=next((line for line in log.splitlines() if line.startswith("error:")), None),
               argv=argv[1:])
    if rc != 0:
        row["log_tail"] = log.splitlines()[-15:]
    return row


def compile_start(checkpoint: str, device: str) -> dict[str, Any]:
    """In a process of its own (``python -m bench.device_cli --compile-start CKPT DEVICE``): pose x1 as
    ``--compile default`` starts it, timed: warm-up, then the shape compiled in the background."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    t0 = time.perf_counter()
    pose = PoseEstimator(checkpoint, device=device, fastpath=FastPath(compile="default"))
    loaded = time.perf_counter() - t0
    warm = pose.warmup(max_batch=1)
    t1 = time.perf_counter()
    ready = pose.wait_compiled(timeout=600)
    return dict(load_s=loaded, warmup_s=warm, compile_s=time.perf_counter() - t1, ready=ready,
                switched_off=pose.switched_off)


def _env(tmp: str) -> dict[str, str]:
    """The runs' environment: offline, Ultralytics' settings and our cache in ``tmp``, this tree importable."""
    return dict(os.environ, HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", PYTHONUNBUFFERED="1",
                YOLO_CONFIG_DIR=str(Path(tmp) / "yolo"), SAPIENS2_STREAM_CACHE=str(Path(tmp) / "cache"),
                PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "clients" / "python"),
                                            os.environ.get("PYTHONPATH", "")]))


def phase_starts(ctx: Ctx) -> None:
    """The first and the second start of a compiled run, each in a process of its own: the second finds the
    shape in Inductor's cache kept in <cache>/compile (the first of a session's runs on a new machine is
    the first start)."""
    import json

    size = ctx.model("0.4b")
    ctx.say(f"\n## Start-up of a compiled run (pose {size} x1, `--compile default`, a process each)\n")
    if ctx.smoke:
        ctx.mark_cuda_only("measured on CUDA: a cold Inductor compile costs this CPU minutes for figures that "
                           "mean nothing (tests/stages/sapiens2/test_compile_cli.py runs the first and second start of the command)")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="starts-") as tmp:
        env = {k: v for k, v in _env(tmp).items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # ours: <cache>/compile
        for start in ("first start", "second start"):
            if ctx.left_s() < 20:
                ctx.say(f"({start} skipped: {ctx.left_s():.0f} s left of this phase)")
                break
            argv = [sys.executable, "-m", "bench.device_cli", "--compile-start", str(ctx.ckpt("pose")), str(ctx.device)]
            try:
                done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=ctx.left_s() - 10)
                result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
                    dict(error=(done.stderr.strip().splitlines() or ["?"])[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
                result = dict(error=f"{type(exc).__name__}: {exc}")
            ctx.report.results.setdefault("starts", []).append(dict(start=start, **result))
            ctx.report.save()
            rows.append([start, result.get("load_s"), result.get("warmup_s"), result.get("compile_s"),
                         result.get("ready"), result.get("error") or ", ".join(result.get("switched_off", {})) or "-"])
    ctx.report.table(["start", "load s", "warm-up s (eager, CUDA graphs)", "compile s (background)", "compiled",
                      "error / switched off"], rows)


def phase_e2e(ctx: Ctx) -> None:
    """The real command on the demo clip (1280x720, 180 frames), one run per row (see the module docstring)."""
    size = ctx.model("0.4b")
    ctx.say(f"\n## End to end: `sapiens2-stream` on the demo clip, {size} checkpoints, {ctx.device.type}, "
            "keypoints read over ZeroMQ\n")
    results = ctx.report.results.setdefault("e2e", [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        env = _env(tmp)
        chosen = [ROWS[i] for i in SMOKE_ROWS] if ctx.smoke else ROWS
        for label, tasks, detector, sources, extra in chosen:
            limit = min(120.0, ctx.left_s() - 5)
            if limit < 30:
                ctx.say(f"({label} skipped: {ctx.left_s():.0f} s left of this phase)")
                continue
            endpoint = f"tcp://127.0.0.1:{_free_port()}"
            row = run_row(ctx, label, _command(ctx, tasks, detector, sources, extra, endpoint), endpoint, env,
                          limit, sources)
            results.append(row)
            ctx.report.save()
            rows.append([label, row["rc"], row["fps_per_source"], row["p50_ms"], row["p95_ms"], row["warm_s"],
                         row["cli_fps"], ", ".join(row["switched_off"]) or "none", row["error"] or "-"])
    ctx.report.table(["run", "exit", "FPS per source", "capture->receive p50 ms", "p95 ms", "warm-up s",
                      "CLI's fps (all sources)", "fast paths switched off", "error"], rows)
    ctx.say("\nA file source delivers every frame as fast as the pipeline takes them: its latency includes the "
            "wait in the source's queue; the paced row (--realtime) shows a camera's. YOLO has random weights "
            "(its boxes are noise, up to 8 per frame): its cost is real.")
    failed = [r["label"] for r in results if r["rc"] != 0]
    if failed:
        raise RuntimeError(f"the command failed in {len(failed)} row(s): {', '.join(failed)} (log tails in the JSON)")


if __name__ == "__main__":  # the compile-start child of compile_starts
    import json

    if len(sys.argv) == 4 and sys.argv[1] == "--compile-start":
        print(json.dumps(compile_start(sys.argv[2], sys.argv[3])), flush=True)
