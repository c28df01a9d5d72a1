"""Device benchmark phase about many sources in one process: N 1080p sources batched through one
engine (one YOLO batch, one pose forward over the N persons of a step), against N times one source.

The target of the many-cameras issue: 4 sources of 1080p, one person each, pose 0.4B at 1024x768,
at least 30 FPS each on one H200 with capture-to-publish p95 at most 80 ms, and N sources in one
process at least 0.9x N times the throughput of one source. Each row runs file-like sources of
prepared frames (every frame, no decode cost, so the rows measure the device's capacity, not a
camera's rate) for a fixed time; latency is from a frame's read to its result reaching the sink.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from bench.bench_multisource import Latency, PreparedSource
from bench.bench_stages import FixedDetector
from bench.device_model import H200_BF16_DENSE_TFLOPS, backbone_macs
from bench.device_stream import YoloThenFixedBoxes, _yolo, camera_like_frame, person_boxes
from bench.devicekit import Ctx
from bench.harness import percentile

SOURCE_COUNTS = (1, 2, 4, 8)
ROW_S = 2.5  # seconds per row (a 1-source row at 30+ FPS gives 75+ frames)
TARGET_SOURCES, TARGET_FPS, TARGET_P95_MS, TARGET_SCALING = 4, 30.0, 80.0, 0.9


class PerSource(Latency):
    """Latency per result, and how many results each source had."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def write(self, result) -> None:
        super().write(result)
        self.counts[result.frame.source_id] += 1


def phase_sources(ctx: Ctx) -> None:
    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from pipeline.run.runner import Runner
    from stages.sapiens2.estimators import PoseEstimator

    h, w = ctx.frame
    yolo, why = _yolo(ctx)
    detector = "YOLO11n (random weights) on every frame as one batch per step, then one fixed box per frame" \
        if yolo is not None else f"one fixed box per frame, no detector ({why})"
    ctx.say(f"\n## Many sources, one process: N {h}p sources -> detector batch -> one pose forward per step\n")
    ctx.say(f"pose {ctx.model('0.4b')} at {ctx.size[0]}x{ctx.size[1]}, {ctx.precision}; one person per frame; "
            f"detector: {detector}; file-like sources of prepared frames (every frame, no decode), {ROW_S} s per "
            "row; latency = capture (read) to the result at the sink; stages overlapped, pinned copies, the "
            "runner pipelined. Memory of N separate processes is estimated as N x the one-source peak (the "
            "CUDA context each would add, about 0.5 GiB, not counted).\n")
    pose = PoseEstimator(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    macs = sum(backbone_macs(pose.model.cfg, *ctx.size))
    images = [camera_like_frame(h, w, seed) for seed in range(4)]
    box = person_boxes(1, w, h)
    counts = SOURCE_COUNTS[:2] if ctx.smoke else SOURCE_COUNTS
    t0 = time.monotonic()
    detect = YoloThenFixedBoxes(yolo, box) if yolo is not None else None
    engine = FrameEngine(Stages(ctx.device, detect or FixedDetector(box), {"pose": pose}))
    engine.warm_up(max_persons=max(counts), max_frames=max(counts))
    if yolo is not None:  # on frames uploaded as the engine does (it gives the detector those)
        from stages.sapiens2.preprocess import to_device_image

        frame = to_device_image(images[0], ctx.device)
        for n in counts:
            yolo.detect_tensors([frame] * n)
    ctx.say(f"warm-up (pose buckets up to {max(counts)}, the detector at every batch size): "
            f"{time.monotonic() - t0:.1f} s\n")
    rows, results = [], ctx.report.results.setdefault("sources", [])
    one = None
    for n in counts:
        if time.monotonic() + ROW_S + 3 > ctx.deadline:
            ctx.say(f"(row of {n} sources skipped: {ctx.left_s():.0f} s left of this phase)")
            continue
        row = _row(ctx, n, images, engine, Runner, macs)
        one = one or (row if n == 1 else None)
        row["vs_n_x_one"] = row["fps"] / (n * one["fps"]) if one and one["fps"] else None
        results.append(row)
        ctx.report.save()
        rows.append([n, row["fps"], row["fps_min_source"], row["p50_ms"], row["p95_ms"], row["frames_per_step"],
                     row["pose_tflops"], f"{100 * row['peak_fraction']:.1f}%", row["vs_n_x_one"], row["peak_gib"],
                     None if one is None or one["peak_gib"] is None else n * one["peak_gib"]])
    ctx.report.table(["sources", "FPS all", "FPS slowest source", "p50 ms", "p95 ms", "frames per step",
                      "pose TFLOP/s", "% of bf16 dense peak", "vs N x one source", "peak GPU GiB",
                      "N processes GiB (est.)"], rows)
    target = next((r for r in results if r["sources"] == TARGET_SOURCES), None)
    if target is None or not ctx.cuda:
        ctx.say("\ntargets: not judged here" + ("" if ctx.cuda else " (not the device)"))
        return
    verdicts = dict(fps_each=target["fps_min_source"] >= TARGET_FPS, p95=target["p95_ms"] <= TARGET_P95_MS,
                    scaling=(target["vs_n_x_one"] or 0) >= TARGET_SCALING)
    ctx.report.results["sources_targets"] = verdicts
    ctx.say(f"\ntargets at {TARGET_SOURCES} sources: >= {TARGET_FPS:.0f} FPS each: "
            f"{'met' if verdicts['fps_each'] else 'MISSED'} ({target['fps_min_source']:.1f}); p95 <= "
            f"{TARGET_P95_MS:.0f} ms: {'met' if verdicts['p95'] else 'MISSED'} ({target['p95_ms']:.1f}); "
            f">= {TARGET_SCALING}x N x one: {'met' if verdicts['scaling'] else 'MISSED'} ({target['vs_n_x_one']:.2f})")


def _row(ctx: Ctx, n: int, images: list[np.ndarray], engine, Runner, macs: float) -> dict:
    ctx.reset_peak()
    sink = PerSource()
    until = time.monotonic() + ROW_S
    sources = [PreparedSource(f"cam{i}", 1 << 30, i, images, until) for i in range(n)]
    t0 = time.perf_counter()
    stats = Runner(sources, engine, [sink], None, True, pipelined=ctx.cuda).run()
    elapsed = time.perf_counter() - t0
    if stats.error is not None:
        raise stats.error
    skip = len(sink.ms) // 10  # warm-up: the first steps of a row
    ms = sink.ms[skip:] or sink.ms
    fps = stats.frames / elapsed
    return dict(sources=n, frames=stats.frames, seconds=elapsed, fps=fps,
                fps_min_source=min(sink.counts.get(f"cam{i}", 0) for i in range(n)) / elapsed,
                p50_ms=percentile(ms, 50), p95_ms=percentile(ms, 95),
                frames_per_step=stats.frames / max(stats.steps, 1),
                pose_tflops=2 * macs * fps / 1e12, peak_fraction=2 * macs * fps / 1e12 / H200_BF16_DENSE_TFLOPS,
                peak_gib=ctx.peak_gib())
