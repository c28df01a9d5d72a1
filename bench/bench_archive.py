"""Archive throughput: ``sapiens2-stream batch`` with W workers against one process looping over the same
files with the same models.

    .venv/bin/python -m bench.bench_archive                                   # 8 clips, tiny pose, CPU
    .venv/bin/python -m bench.bench_archive --videos 32 --frames 60 --workers 1 2 4 --json out/archive.json
    .venv/bin/python -m bench.bench_archive --run-args "--tasks pose,seg --device cuda" --workers 1 2

Both sides run the same code per video (``pipeline.cluster.archive_worker.process_video``: PyAV decode, the
models, annotation, the mp4 encode and the keypoint JSONL) with the same config, parsed from
``--run-args`` by the batch command's own parser.

* loop: this process loads the models once and does the videos one after another (a shell loop over
  ``sapiens2-stream --source`` without reloading the models per file).
* batch W: the real CLI in a subprocess with ``--workers W`` on a fresh local Ray (or ``--address``).

Printed per mode: videos, frames, the median seconds per video, end-to-end seconds (loop: model load +
videos; batch: process start to exit, Ray start and actor model loads included), steady seconds
(first video's start to the last one's end, from the outcome rows), videos/s and frames/s over both
spans, steady frames/s relative to the loop, and the 1-minute load average when the mode started
(``--wait-quiet S`` waits for other jobs to leave the CPU first, up to S seconds). Clips are generated
(a moving block on a gradient, H.264); the default run flags use tiny RANDOM-weight checkpoints, the
whole frame as the person and the CPU, so that it runs anywhere; on a GPU cluster pass real ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import dump_json, load_average, machine_info, percentile, table, wait_quiet
from pipeline.cli.main import build_parser
from pipeline.cluster.archive import SUMMARY, Item, batch_config
from pipeline.cluster.archive_worker import process_video
from pipeline.run.build import build_stages
from tests.cliutil import make_video

CLI = [str(Path(sys.executable).parent / "sapiens2-stream")]
OFFLINE_RUN_ARGS = "--tasks pose --detector full-frame --fallback-tiny --device cpu --dtype float32 --no-progress"


def make_archive(folder: Path, videos: int, frames: int, width: int, height: int) -> list[Item]:
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for i in range(videos):
        path = make_video(folder / f"clip{i:03d}.mp4", frames, width, height)
        items.append(Item(path.stem, str(path), "bench"))
    return items


def figures(mode: str, rows: list[dict[str, Any]], total_s: float) -> dict[str, Any]:
    """One table row from the outcome rows of a mode and its end-to-end time."""
    done = [r for r in rows if r["status"] == "done"]
    frames = sum(r["frames"] for r in done)
    steady = max(r["finished"] for r in done) - min(r["started"] for r in done) if done else float("nan")
    return {"mode": mode, "videos": len(done), "failed": len(rows) - len(done), "frames": frames,
            "video_s_p50": percentile([r["seconds"] for r in done], 50) if done else float("nan"),
            "total_s": total_s, "steady_s": steady, "videos_per_s": len(done) / steady,
            "frames_per_s": frames / steady, "videos_per_s_e2e": len(done) / total_s,
            "frames_per_s_e2e": frames / total_s}


def run_loop(items: list[Item], run_args: list[str], out: Path, threads: int) -> dict[str, Any]:
    """One process, models loaded once, every video in turn through the same per-video code as batch."""
    args = build_parser().parse_args(["batch", "unused", "--out", str(out), *run_args])
    cfg = batch_config(args)
    logging.getLogger().setLevel(logging.ERROR)  # the per-video notes (random weights) would bury the table
    torch.set_num_threads(threads)
    start = time.perf_counter()
    stages = build_stages(cfg)
    rows = [process_video(cfg, stages, item, out, "loop") for item in items]
    return figures("loop", rows, time.perf_counter() - start)


def run_batch(archive: Path, run_args: list[str], out: Path, workers: int, threads: int,
              address: str | None) -> dict[str, Any]:
    """The real CLI with --workers; outcome rows from its summary.jsonl."""
    command = [*CLI, "batch", str(archive), "--out", str(out), "--workers", str(workers),
               "--cpus-per-worker", str(threads), *run_args, *(["--address", address] if address else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    ran = subprocess.run(command, env=env, capture_output=True, text=True)
    total = time.perf_counter() - start
    if ran.returncode != 0:
        sys.exit(f"batch --workers {workers} failed (rc {ran.returncode}):\n{ran.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / SUMMARY).read_text().splitlines()]
    return figures(f"batch W={workers}", rows, total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--frames", type=int, default=16, help="frames per clip")
    ap.add_argument("--size", default="160x120", metavar="WxH", help="clip size")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="batch runs, one per worker count")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the loop and of each batch worker")
    ap.add_argument("--run-args", default=OFFLINE_RUN_ARGS, help="run flags of both modes (one string)")
    ap.add_argument("--address", help="a running Ray cluster for the batch runs (default: a local Ray)")
    ap.add_argument("--keep", help="generate the clips and write the outputs here instead of a temporary folder")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each mode, wait up to S seconds for other jobs to leave the CPU idle")
    ap.add_argument("--json", help="write the numbers and the settings here")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    run_args = shlex.split(args.run_args)
    with tempfile.TemporaryDirectory(prefix="bench-archive-") as tmp:
        root = Path(args.keep or tmp)
        items = make_archive(root / "archive", args.videos, args.frames, width, height)
        results = []
        for workers in [0, *args.workers]:  # 0: the loop
            if args.wait_quiet:
                wait_quiet(args.wait_quiet)
            load = load_average()
            if workers == 0:
                row = run_loop(items, run_args, root / "out-loop", args.threads)
            else:
                row = run_batch(root / "archive", run_args, root / f"out-w{workers}", workers, args.threads,
                                args.address)
            results.append({**row, "load_1m": load})
    base = results[0]["frames_per_s"]
    for row in results:
        row["steady_vs_loop"] = row["frames_per_s"] / base
    print(f"{args.videos} clips x {args.frames} frames at {width}x{height}, run flags: {args.run_args}; "
          f"{args.threads} torch thread(s) per process/worker, {os.cpu_count()} CPUs")
    print(table(results, ["mode", "videos", "failed", "frames", "video_s_p50", "total_s", "steady_s", "videos_per_s",
                          "frames_per_s", "videos_per_s_e2e", "frames_per_s_e2e", "steady_vs_loop", "load_1m"]))
    if args.json:
        dump_json(args.json, {"machine": machine_info(), "settings": vars(args), "results": results})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
