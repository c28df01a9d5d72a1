"""Many sources, one process: throughput and latency of N sources batched through one engine, against
the same N sources in N separate processes (each loading its own models), on this machine.

    .venv/bin/python -m bench.bench_multisource                      # tiny models, CPU
    .venv/bin/python -m bench.bench_multisource --config medium      # D=256, 8 layers, 512x384 input

On a GPU, the device benchmark's ``sources`` phase (bench/device_sources.py) measures the same at
0.4B with 1080p frames and the real YOLO batch (the issue's 4 x 30 FPS target); this script's
``--device cuda`` runs its tiny or medium models there.

Each source is a file-like stream of prepared frames (no decoding), one person per frame (a fixed
box: the detector is not what is measured), pose + segmentation. Batched: one Runner over N sources
(one detector batch, one seg forward over N frames, one pose forward over N persons per step).
Separate: N processes, each one source, loaded and warmed up, then started together (throughput: all
their frames over the span from the first start to the last end). Printed per N: frames per second in
all, capture-to-result latency p50/p95, the ratio batched / separate and batched / (N x one source),
and peak memory (RSS on the CPU, device memory on CUDA) of the one process vs the N.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from bench.harness import REPO, percentile
from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from pipeline.run.runner import Runner
from stages.device import resolve_device
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.tiny import make_tiny
from stages.types import Detections, Frame, StreamInfo

SIZES = {"tiny": dict(hidden=64, layers=4, heads=4, image_size=(256, 192)),
         "medium": dict(hidden=256, layers=8, heads=8, image_size=(512, 384))}
H, W = 360, 480


class OnePerson:
    random_weights = True

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        return [Detections(np.array([[W * 0.3, H * 0.1, W * 0.7, H * 0.95]], np.float32), [0.9], [-1])
                for _ in images]


class PreparedSource:
    """A file-like source of ``n`` prepared frames (every frame, in order; no decode cost), or of as
    many as come before ``until`` (time.monotonic()). ``images``: the frames to cycle through (4
    random ones of H x W by default)."""

    frames_dropped = reopens = decode_errors = 0
    health = "ok"

    def __init__(self, source_id: str, n: int, seed: int, images: list[np.ndarray] | None = None,
                 until: float | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.images = images or [rng.integers(0, 255, (H, W, 3), dtype=np.uint8) for _ in range(4)]
        self.source_id, self.n, self.next, self.until = source_id, n, 0, until
        h, w = self.images[0].shape[:2]
        self.info = StreamInfo(source_id, w, h, 30.0, Fraction(1, 30), live=False)

    def read(self, timeout: float) -> Frame:
        from pipeline.sources import SourceEnded

        if self.next >= self.n or (self.until is not None and time.monotonic() >= self.until):
            raise SourceEnded("end")
        i, self.next = self.next, self.next + 1
        return Frame(i, self.images[i % len(self.images)], i, Fraction(1, 30), time.time_ns(), self.source_id)

    def stop(self) -> None:
        pass


class Latency:
    def __init__(self) -> None:
        self.ms: list[float] = []

    def open(self, info) -> None:
        pass

    def write(self, result) -> None:
        self.ms.append((time.time_ns() - result.frame.capture_ns) / 1e6)

    def close(self) -> None:
        pass


def checkpoints(config: str, folder: Path, write: bool = True) -> dict[str, Path]:
    """The random-init checkpoints of ``config`` in ``folder``, written first unless ``write`` is false
    (the separate processes read the parent's: N of them writing the same files would race)."""
    paths = {task: folder / f"{config}-{task}" for task in ("pose", "seg")}
    return {task: Path(make_tiny(path, task, **SIZES[config])) if write else path for task, path in paths.items()}


def run_batched(n: int, frames: int, ckpts: dict[str, Path], device: torch.device, warmup: int,
                ready=None) -> dict:
    """N sources through one engine; ``ready()`` is called after the warm-up, before the measured run."""
    estimators = {task: estimator_for(task)(load_model(path, device=device)) for task, path in ckpts.items()}
    engine = FrameEngine(Stages(device, OnePerson(), estimators))
    if device.type == "cuda":
        engine.warm_up(max_persons=n, max_frames=n)
    # warm-up run (allocations, kernels), then the measured one
    Runner([PreparedSource(f"w{i}", warmup, i) for i in range(n)], engine, [], None, True).run()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if ready is not None:
        ready()
    sink = Latency()
    wall0, start = time.time(), time.perf_counter()
    stats = Runner([PreparedSource(f"cam{i}", frames, i) for i in range(n)], engine, [sink], None, True).run()
    elapsed = time.perf_counter() - start
    if stats.error is not None:
        raise stats.error
    return {"fps": stats.frames / elapsed, "frames": stats.frames, "steps": stats.steps, "start": wall0,
            "end": wall0 + elapsed, "p50_ms": percentile(sink.ms, 50), "p95_ms": percentile(sink.ms, 95),
            "memory_mb": peak_memory_mb(device)}


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_separate(n: int, args: argparse.Namespace, folder: Path) -> dict:
    """N processes of one source each, started together; each reports its own figures."""
    command = [sys.executable, "-m", "bench.bench_multisource", "--child", "--config", args.config, "--frames",
               str(args.frames), "--device", args.device, "--warmup", str(args.warmup), "--threads", str(args.threads),
               "--ckpt-dir", str(folder)]
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
             for _ in range(n)]
    try:
        for p in procs:  # every process has loaded its models and warmed up ...
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"a separate process failed before its run (exit {p.wait(60)}); its error is above")
        for p in procs:  # ... then all start together
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = [json.loads(p.communicate(timeout=3600)[0].strip().splitlines()[-1]) for p in procs]
    finally:  # one that failed ends the others (they would wait for "go" on a pipe nobody writes)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    return {"fps": sum(r["fps"] for r in reports), "fps_wall": n * args.frames / elapsed,
            "p50_ms": float(np.mean([r["p50_ms"] for r in reports])),
            "p95_ms": float(np.mean([r["p95_ms"] for r in reports])),
            "memory_mb": float(sum(r["memory_mb"] for r in reports))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--sources", default="1,2,4,8")
    ap.add_argument("--frames", type=int, default=40, help="frames per source in the measured run")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads per process (0: leave as is)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.child:
        def ready() -> None:
            print("ready", flush=True)
            sys.stdin.readline()

        ckpts = checkpoints(args.config, Path(args.ckpt_dir), write=False)
        report = run_batched(1, args.frames, ckpts, device, args.warmup, ready)
        print(json.dumps(report), flush=True)
        return 0
    counts = [int(n) for n in args.sources.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpts = checkpoints(args.config, folder)
        one = None
        for n in counts:
            batched = run_batched(n, args.frames, ckpts, device, args.warmup)
            one = one or (batched if n == 1 else run_batched(1, args.frames, ckpts, device, args.warmup))
            separate = run_separate(n, args, folder)
            row = {"sources": n, "batched": batched, "separate": separate,
                   "batched_vs_separate": batched["fps"] / separate["fps_wall"],
                   "batched_vs_n_x_one": batched["fps"] / (n * one["fps"]),
                   "memory_saving": 1 - batched["memory_mb"] / separate["memory_mb"]}
            rows.append(row)
            print(f"{n} sources: batched {batched['fps']:.1f} fps (p50 {batched['p50_ms']:.0f} ms, p95 "
                  f"{batched['p95_ms']:.0f} ms, {batched['frames'] / batched['steps']:.2f} frames per step), "
                  f"separate {separate['fps_wall']:.1f} fps (p50 {separate['p50_ms']:.0f} ms); batched/separate "
                  f"{row['batched_vs_separate']:.2f}, batched/(N x one) {row['batched_vs_n_x_one']:.2f}; memory "
                  f"{batched['memory_mb']:.0f} MB vs {separate['memory_mb']:.0f} MB in {n} processes", flush=True)
    print(f"config {args.config}, {args.frames} frames per source of {W}x{H}, pose + seg, one person each, "
          f"device {device}, torch threads {torch.get_num_threads()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "device": str(device), "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
