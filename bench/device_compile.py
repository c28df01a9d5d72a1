"""Device benchmark phases about the fast path: each fast-path switch against the default, and
torch.compile with CUDA graphs."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from bench.device_stream import person_boxes
from bench.devicekit import Ctx, p50, p95
from pipeline.fallback import DENSE_STREAMS
from stages.sapiens2.weights import load_model


def _ablation_row(ctx: Ctx, rows: list[list[Any]], label: str, make: Callable[[], Any], crops: torch.Tensor, n: int,
                  base: torch.Tensor | None, base_ms: float | None) -> tuple[Any, torch.Tensor | None, float | None]:
    """Build an estimator with make(), time its infer on crops and take its largest difference from
    base (relative to base's largest value). A variant that fails costs its own row only."""
    try:
        est = make()
        with torch.inference_mode():
            out = est.infer(crops, n).float()
            samples = ctx.ms(lambda: est.infer(crops, n))
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel that passed the probe but rejects the real call
        if base is None:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        ctx.report.results["fastpath"].append(dict(variant=label, error=f"{type(exc).__name__}: {first}"))
        rows.append([label, f"failed: {type(exc).__name__}: {first}", None, None, None, "-", "-"])
        return None, None, None
    diff = None if base is None else float((out - base).abs().max() / base.abs().max())
    ms = p50(samples)
    row = dict(variant=label, resolved=est.fastpath.describe(est.model), batch=int(crops.shape[0]), ms=samples,
               max_rel_diff=diff)
    ctx.report.results["fastpath"].append(row)
    rows.append([label, row["resolved"], row["batch"], ms, p95(samples),
                 "-" if base_ms is None else f"{base_ms / ms:.2f}x", "-" if diff is None else f"{diff:.1e}"])
    return est, out, ms


def phase_fastpath(ctx: Ctx) -> None:
    """Each fast-path switch against the default, one at a time, on the pose model with 4 persons."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    ctx.say(f"\n## Fast-path switches, pose {ctx.model('0.4b')}, {ctx.precision}, 4 persons "
            "(crops -> heatmaps; CUDA events on a GPU)\n")
    ctx.report.results["fastpath"] = []
    rows: list[list[Any]] = []
    rng = np.random.default_rng(0)
    h, w = ctx.frame
    image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    boxes = person_boxes(4, w, h)
    fused = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype)

    def estimator(model=fused, **kwargs) -> Callable[[], PoseEstimator]:
        return lambda: PoseEstimator(model, input_size=ctx.size, **kwargs)

    default = estimator()()
    with torch.inference_mode():
        image_t = default.image_tensor(image)
        boxes_t = torch.as_tensor(boxes, device=ctx.device)
        crops = default.preprocess(image_t, boxes_t)
        crops3 = default.preprocess(image_t, boxes_t[:3])  # 3 persons, padded to a batch of 4
    _, base, base_ms = _ablation_row(ctx, rows, "default", lambda: default, crops, 4, None, None)
    for attention in ("flash", "efficient", "cudnn", "math"):
        _ablation_row(ctx, rows, f"attention {attention}", estimator(fastpath=FastPath(attention=attention)), crops,
                      4, base, base_ms)
    flip = not (default.fastpath.channels_last or False)
    _ablation_row(ctx, rows, f"channels_last {'on' if flip else 'off'}",
                  estimator(fastpath=FastPath(channels_last=flip)), crops, 4, base, base_ms)
    estimator()()  # the shared model back to the default layout
    # Buckets: 3 persons padded to a batch of 4 (default) vs exactly 3.
    _, padded3, padded_ms = _ablation_row(ctx, rows, "3 persons, padded to bucket 4 (default)", lambda: default,
                                          crops3, 3, None, None)
    _ablation_row(ctx, rows, "3 persons, no buckets (batch 3)", estimator(buckets=False), crops3[:3], 3, padded3,
                  padded_ms)
    ctx.report.table(["variant", "resolved options", "batch", "ms p50", "p95", "speed vs default",
                      "max abs diff / max"],
                     rows)
    ctx.say("\nSpeed and difference are against the row marked default above each; \"resolved\" shows what ran "
            "(a backend that cannot run here falls back to auto, with a warning in the log). Buckets exist so "
            "1-8 persons need 4 shapes (1/2/4/8) instead of 8 for cuDNN autotuning and compiled graphs.")


def phase_compile(ctx: Ctx) -> None:
    """torch.compile with CUDA graphs ("reduce-overhead"): its start-up cost, its per-call gain, and
    whether the detector still runs beside the Sapiens2 work (each stage's graphs on its own lane)."""
    from pipeline.engine import FrameEngine
    from pipeline.stages_setup import Stages
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.sapiens2.fastpath import FastPath

    mode = "default" if ctx.smoke else "reduce-overhead"
    ctx.say(f"\n## torch.compile (mode {mode}), pose {ctx.model('0.4b')}, {ctx.precision}, 4 persons\n")
    model = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype)
    eager = PoseEstimator(model, input_size=ctx.size)
    compiled = PoseEstimator(model, input_size=ctx.size, fastpath=FastPath(compile=mode))
    if ctx.smoke:
        # Dynamo and AOTAutograd without Inductor's code generation: a cold Inductor compile of even the
        # tiny model costs the CPU 30 s, for figures that mean nothing here (tests/test_fastpath.py
        # compiles with Inductor and checks the outputs).
        compiled._forward = torch.compile(model, backend="aot_eager", dynamic=False, fullgraph=True)
        ctx.say("(smoke run: compiled with backend aot_eager, not Inductor)\n")
    seg = Segmenter(ctx.ckpt("seg"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    h, w = ctx.frame
    detector = TimedDetector(ctx, person_boxes(4, w, h))
    engine = FrameEngine(Stages(ctx.device, detector, {"pose": compiled, "seg": seg}))
    # On the pose lane, where the engine replays it: a graph belongs to the stream it was captured on.
    with torch.inference_mode(), engine.lanes.use("pose"):
        crops = torch.randn(4, 3, *ctx.size, device=ctx.device)  # float32 as the engine's crops: one compile
        base = eager.infer(crops, 4).float()
        eager_ms = ctx.ms(lambda: eager.infer(crops, 4))  # first: kept even if compiling is cut short
        ctx.report.results["compile"] = dict(mode=mode, eager_ms=eager_ms)
        ctx.report.save()
        ctx.say(f"compiling (eager p50 {p50(eager_ms):.1f} ms; {ctx.left_s():.0f} s left before the watchdog) ...")
        t0 = time.perf_counter()
        for _ in range(3):  # compile, capture the graph, replay
            out = compiled.infer(crops, 4)
        ctx.sync()
        startup = time.perf_counter() - t0
        diff = float((out.float() - base).abs().max() / base.abs().max())
        compiled_ms = ctx.ms(lambda: compiled.infer(crops, 4))
    graphs = len(getattr(compiled._forward, "captures", []))  # ours (stages.sapiens2.graphs); a failed capture raises
    ctx.report.results["compile"] = dict(mode=mode, startup_s=startup, eager_ms=eager_ms, compiled_ms=compiled_ms,
                                         max_rel_diff=diff, cuda_graphs_captured=graphs)
    ctx.report.table(["path", "ms p50", "p95", "speed-up", "start-up (compile) s", "max abs diff / max"], [
        ["eager (default)", p50(eager_ms), p95(eager_ms), "-", "-", "-"],
        [f"compiled, {mode}", p50(compiled_ms), p95(compiled_ms), f"{p50(eager_ms) / p50(compiled_ms):.2f}x",
         f"{startup:.1f}", f"{diff:.1e}"],
    ])
    if mode == "reduce-overhead":
        ctx.say(f"\nCUDA graphs captured on the pose lane: {graphs}.")
    ctx.say("\nThe start-up cost is paid once per input shape (one shape here; a pipeline warms every pose "
            "bucket at start-up, `--compile` logs the total).")
    if ctx.left_s() < 20:
        ctx.say(f"\n(overlap rows skipped: {ctx.left_s():.0f} s left of this phase)")
        return
    overlap_rows(ctx, engine, detector, mode, FrameEngine, steps=4 if ctx.smoke else 30)  # smoke: the code path


class TimedDetector:
    """The random YOLO11n on every frame (its cost is real, its boxes are not) and then fixed boxes;
    on a GPU, CUDA events around its device work, on the detect lane where the engine calls it."""

    random_weights = True

    def __init__(self, ctx: Ctx, boxes: np.ndarray) -> None:
        from bench.bench_stages import FixedDetector
        from bench.device_stream import _yolo

        self.fixed = FixedDetector(boxes)
        self.yolo, self.why = _yolo(ctx)
        self.cuda = ctx.cuda
        self.spans: list[tuple[Any, Any]] = []

    def detect_tensors(self, images: list[torch.Tensor]):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if self.yolo is not None:
            self.yolo.detect_tensors(images)
        if self.cuda:
            end.record()
            self.spans.append((start, end))
        return [self.fixed.detections for _ in images]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def overlap_rows(ctx: Ctx, engine, detector: TimedDetector, mode: str, FrameEngine, steps: int = 30) -> None:
    """Steps pipelined as the runner does (submit t, then finish t-1), lanes overlapped and on one
    stream: per lane its device time, its span relative to the step's upload, and the sum of the lanes'
    times over the wall time per step (> 1: lanes overlap)."""
    from bench.device_stream import camera_like_frame
    from stages.types import Frame

    h, w = ctx.frame
    image = camera_like_frame(h, w)
    yolo = "YOLO11n" if detector.yolo is not None else f"no YOLO ({detector.why})"
    ctx.say(f"\n### Overlap in compile mode {mode}: detector ({yolo}) + seg (eager) + pose (compiled, 4 persons), "
            f"{steps} steps of one {h}p frame\n")
    rows, results = [], ctx.report.results.setdefault("compile_overlap", [])
    for overlap in (True, False):
        if ctx.left_s() < 10:
            ctx.say(f"(row overlap={overlap} skipped: {ctx.left_s():.0f} s left of this phase)")
            continue
        eng = engine if overlap else FrameEngine(engine.stages, overlap=False)
        warm_reachable(eng, persons=4)  # this thread, these lanes: the graphs it replays below
        if detector.yolo is not None:
            detector.yolo.detect_tensors([engine_image(eng, image)])
        detector.spans.clear()
        pendings, done = [], []
        t0 = time.perf_counter()
        for i in range(steps):
            pendings.append(eng.submit_batch([Frame(i, image, i, None, time.time_ns(), source_id="bench")]))
            if len(pendings) > 1:
                eng.finish_batch(pendings[-2], True)
                done.append(pendings[-2])
        eng.finish_batch(pendings[-1], True)
        done.append(pendings[-1])
        wall = (time.perf_counter() - t0) * 1000.0 / steps
        if not ctx.cuda:  # the code path ran; the compile phase's own figures above are the measurement here
            ctx.say(f"{steps} steps ran (overlap={overlap}); lane spans are CUDA events: on the CPU the stages "
                    "run in order, nothing to measure")
            continue
        row = _lane_figures(done[steps // 3:], detector.spans[steps // 3:], wall)
        row.update(overlap=overlap, steps=steps)
        results.append(row)
        ctx.report.save()
        rows.append(["yes" if overlap else "no (one stream)", row["wall_ms"], row["summed_ms"],
                     f"{row['summed_over_wall']:.2f}", row["detect_ms"], row["detect_overlap_ms"],
                     row["timeline"]])
    ctx.report.table(["lanes overlapped", "wall ms per step", "sum of lanes ms", "sum / wall",
                      "detect ms", "detect beside seg/pose ms", "last step's spans (ms from its upload)"], rows)
    ctx.say("\nsum / wall > 1: the lanes ran at the same time; 'detect beside' is the part of the detector's "
            "device span that fell inside the seg or pose span of the same or the step before (mean per step).")


def warm_reachable(engine, persons: int) -> None:
    """Warm what these steps reach, each on the lane that replays it: pose at the bucket of ``persons``
    (the only one fixed boxes reach: the engine's warm_up would compile every bucket below it too)
    and the dense stages at one frame."""
    from stages.sapiens2.buckets import bucket

    pose = engine.stages.estimators["pose"]
    with torch.inference_mode(), engine.lanes.use("pose"):
        crops = torch.zeros(bucket(persons), 3, *pose.input_size, device=pose.device)  # float32, as crops are
        for _ in range(3 if pose.fastpath.cuda_graphs else 1):  # compile, capture, replay
            pose.infer(crops, persons)
    for task, est in engine.stages.estimators.items():
        if task != "pose":
            with engine.lanes.use(dict(DENSE_STREAMS)[task]):
                est.warmup(1)


def engine_image(engine, image: np.ndarray) -> torch.Tensor:
    """A frame as the engine uploads it, for the detector's warm-up."""
    from stages.sapiens2.preprocess import to_device_image

    return to_device_image(image, engine.device, engine.pinned)


def _lane_figures(pendings: list, spans: list, wall_ms: float) -> dict[str, Any]:
    """Device time per lane and the detector's overlap with the dense and pose spans (CUDA events)."""
    per: dict[str, list[float]] = {}
    beside, timeline, previous = [], "", None
    for pending, (d0, d1) in zip(pendings, spans):
        marks = pending.clock.marks
        ref = marks["upload"][0]
        span = {name: (ref.elapsed_time(a), ref.elapsed_time(b)) for name, (a, b) in marks.items() if b is not None}
        span["detect"] = (ref.elapsed_time(d0), ref.elapsed_time(d1))
        for name, (a, b) in span.items():
            per.setdefault(name, []).append(b - a)
        others = [v for k, v in span.items() if k in ("seg", "pose")]
        if previous is not None:  # the step before's pose, in this step's time
            others.append((ref.elapsed_time(previous[0]), ref.elapsed_time(previous[1])))
        beside.append(sum(_overlap(span["detect"], o) for o in others))
        previous = marks.get("pose")
        timeline = ", ".join(f"{k} {a:.1f}-{b:.1f}" for k, (a, b) in sorted(span.items(), key=lambda kv: kv[1][0]))
    means = {k: sum(v) / len(v) for k, v in per.items()}
    summed = sum(means.values())
    return dict(wall_ms=wall_ms, summed_ms=summed, summed_over_wall=summed / wall_ms, lane_ms=means,
                detect_ms=means.get("detect"), detect_overlap_ms=sum(beside) / max(len(beside), 1), timeline=timeline)
