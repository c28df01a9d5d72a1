"""What a subscriber costs the publisher: ZmqPublisher.write per 720p frame with no subscriber, with
one that reads, and with one that stopped reading (SIGSTOP: its queue fills, then its messages are
dropped), each subscribing to every topic (so the frame is JPEG-encoded for it).

A stopped subscriber must cost next to nothing: the publisher never waits for it (PUB sockets drop
at the high-water mark), and once the queue of a picture topic's one subscriber is full it stops
encoding that topic's pictures (a try after 0.2 s, doubling to 2 s while it stays full), counting
each frame it skips. The pipeline's own frame rate with no, a reading and a stopped subscriber is
measured end to end by bench/bench_faults.py.

    .venv/bin/python -m bench.bench_publish [--iters 60] [--warmup 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from bench.harness import add_common_args, dump_json, load_average, machine_info, measure, table
from pipeline.sinks.publisher import ZmqPublisher
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo

H, W, K = 720, 1280, 308
CLI = Path(sys.executable).parent / "sapiens2-stream"


def _results(n: int) -> list[FrameResult]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    out = []
    for i in range(n):
        frame = Frame(i, image, i, Fraction(1, 30), time.time_ns(), source_id="cam0")
        detections = Detections(np.array([[100, 50, 400, 700]], np.float32), np.ones(1, np.float32), np.zeros(1))
        keypoints = Keypoints(rng.random((1, K, 2), dtype=np.float32) * 500, rng.random((1, K), dtype=np.float32))
        out.append(FrameResult(frame, detections, keypoints, annotated=image, latency_ms={}, drops={}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, iters=60, warmup=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = _results(args.iters + args.warmup)
    step = iter(range(10**9))

    def write() -> None:
        publisher.write(results[next(step) % len(results)])

    publisher = ZmqPublisher("tcp://127.0.0.1:*")
    publisher.open(StreamInfo("cam0", W, H, 30.0, Fraction(1, 30), live=True))
    rows, load0 = [], load_average()
    stats = {"none": measure(write, args.iters, args.warmup)}
    subscriber = subprocess.Popen([str(CLI), "subscribe", "--endpoint", publisher.endpoint, "--topic", "", "--quiet"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not publisher.wait_for_subscriber("frame.cam0", 60):
            raise SystemExit("the subscriber did not connect within 60 s")
        stats["reading"] = measure(write, args.iters, args.warmup)
        os.kill(subscriber.pid, signal.SIGSTOP)
        for _ in range(200):  # fill its queue to the high-water mark and beyond
            write()
        dropped_before = sum(publisher.stats.dropped.values())
        stats["stopped"] = measure(write, args.iters, args.warmup)
        dropped = sum(publisher.stats.dropped.values()) - dropped_before
    finally:
        os.kill(subscriber.pid, signal.SIGCONT)
        subscriber.terminate()
        subscriber.wait(30)
        publisher.close()
    for name, what in (("none", "no subscriber"), ("reading", "one subscriber reading every topic"),
                       ("stopped", "the same subscriber stopped (SIGSTOP), queue full")):
        s = stats[name]
        rows.append({"case": what, "p50 ms": s.p50, "p95 ms": s.p95, "vs reading": s.p50 / stats["reading"].p50})
    print(f"ZmqPublisher.write per {W}x{H} frame (JPEG q80 when subscribed), {args.iters} iters "
          f"(+{args.warmup} warm-up); 1-min load {load0} -> {load_average()}")
    print(table(rows, ["case", "p50 ms", "p95 ms", "vs reading"]))
    print(f"drops counted while the stopped subscriber was timed: {dropped} messages in {args.iters + args.warmup} "
          "writes (it is the only subscriber: every message it lost is counted, its frames are not encoded; WIRE.md)")
    if args.json:
        dump_json(args.json, {"rows": rows, "stopped_dropped": dropped, "stats": stats, "machine": machine_info()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
