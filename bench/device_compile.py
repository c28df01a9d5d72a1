"""Device benchmark phases about the fast paths: eager against eager + CUDA graphs against compiled +
CUDA graphs (the paths a run takes), each fast-path switch against the default, the attention
kernels each path runs, and the lanes' overlap with compiled graphs."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import numpy as np
import torch

from bench.device_stream import person_boxes
from bench.devicekit import Ctx
from bench.harness import sync
from stages.sapiens2.weights import load_model
from stages.tasks import TASKS


def _ablation_row(ctx: Ctx, rows: list[list[Any]], label: str, make: Callable[[], Any], crops: torch.Tensor, n: int,
                  base: torch.Tensor | None, base_ms: float | None) -> tuple[Any, torch.Tensor | None, float | None]:
    """Build an estimator with make(), time its infer on crops and take its largest difference from
    base (relative to base's largest value). A variant that fails costs its own row only."""
    try:
        est = make()
        with torch.inference_mode():
            out = est.infer(crops, n).float()
            stats = ctx.measure(lambda: est.infer(crops, n))
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel that passed the probe but rejects the real call
        if base is None:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        ctx.report.results["fastpath"].append(dict(variant=label, error=f"{type(exc).__name__}: {first}"))
        rows.append([label, f"failed: {type(exc).__name__}: {first}", None, None, None, "-", "-"])
        return None, None, None
    diff = None if base is None else float((out - base).abs().max() / base.abs().max())
    ms = stats.p50
    row = dict(variant=label, resolved=est.fastpath.describe(), batch=int(crops.shape[0]), ms=stats.samples_ms,
               max_rel_diff=diff)
    ctx.report.results["fastpath"].append(row)
    rows.append([label, row["resolved"], row["batch"], ms, stats.p95,
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


def _run(est, pixels: torch.Tensor) -> Any:
    """One forward of an estimator the way the engine calls it (pose: its persons' rows)."""
    with torch.inference_mode():
        return est.infer(pixels, len(pixels)) if est.task == "pose" else est.infer(pixels)


def _compiled(ctx: Ctx, est, pixels: torch.Tensor, budget_s: float) -> tuple[bool, float]:
    """Compile this input shape in the background as a run does, wait for it (at most ``budget_s``)
    and take the first step that switches to it (its check against eager). (ready, compile seconds)."""
    est.start_compile()
    ready = est.wait_compiled(timeout=max(1.0, budget_s))
    if ready:
        _run(est, pixels)  # the switch: checked against eager here, then its graph captured
        _run(est, pixels)
        ctx.sync()
    return ready and "compile" not in est.switched_off, est.compile_seconds(tuple(pixels.shape))


@contextlib.contextmanager
def smoke_compile(ctx: Ctx):
    """In the smoke run, compile with dynamo + AOTAutograd but not Inductor's code generation: a cold
    Inductor compile of even the tiny model costs the CPU 30-45 s per shape, for figures that mean
    nothing here (tests/stages/sapiens2/test_fastpath.py and test_compile_cli.py compile with Inductor)."""
    if not ctx.smoke:
        yield
        return
    import stages.sapiens2.forward as forward_mod
    from stages.sapiens2.fastpath import attention_context

    real = forward_mod.compile_model

    def aot_eager(model, mode, attention="auto"):
        def make(shape):
            def forward(pixels):
                with attention_context(attention):
                    return model(pixels)
            return torch.compile(forward, backend="aot_eager", dynamic=False, fullgraph=True)
        return make

    forward_mod.compile_model = aot_eager
    ctx.say("(smoke run: compiled with backend aot_eager, not Inductor)\n")
    try:
        yield
    finally:
        forward_mod.compile_model = real


def phase_graphs(ctx: Ctx) -> None:
    """The paths a run takes, on the stream that replays them: eager, eager + CUDA graphs (the default on
    CUDA) and compiled + CUDA graphs (--compile), for pose x1/x4/x8 and seg; warm-up (capture) and
    compile seconds; what each fast path's check said; the attention kernels of each path and case."""
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.sapiens2.fastpath import FastPath

    mode = "default"
    ctx.say(f"\n## Eager vs CUDA graphs vs compiled, {ctx.model('0.4b')}, {ctx.precision}, input "
            f"{ctx.size[0]}x{ctx.size[1]} (CUDA events on a GPU)\n")
    results = ctx.report.results.setdefault("graphs", [])
    models = {"pose": load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype),
              "seg": load_model(ctx.ckpt("seg"), device=ctx.device, dtype=ctx.dtype)}
    classes = {"pose": PoseEstimator, "seg": Segmenter}
    ctx.sync()  # what loading queued on the default stream, done before the lane reads the weights
    # (the smoke run: one pose batch above 1 and seg, the code path of every case)
    cases = [("pose", 2), ("seg", 1)] if ctx.smoke else [("pose", 1), ("pose", 4), ("pose", 8), ("seg", 1)]
    paths = [("eager", FastPath(cuda_graphs="off")), ("eager + CUDA graphs", FastPath()),
             (f"compiled ({mode}) + CUDA graphs", FastPath(compile=mode))]
    lane = torch.cuda.Stream(ctx.device) if ctx.cuda else None
    # Before any graph of this phase is captured: a CUDA graph captured before the process's first profiler
    # session must not replay under one (pytorch/pytorch#75504), and a profiler that sees no kernels here
    # (CUPTI unavailable) is said once instead of as an empty column in every row.
    profiled = profiler_probe(ctx)
    eager_ms: dict[tuple[str, int], float] = {}
    with smoke_compile(ctx):
        ctx.report.table_header(["path", "case", "ms p50", "p95", "vs eager", "warm-up / capture s", "compile s",
                                 "fast-path checks", f"attention ({profiled or 'not profiled'})"])
        _graph_rows(ctx, paths, cases, models, classes, lane, eager_ms, results, profiled is not None)
    ctx.say("\nEvery path ran on one side stream, as a stage's lane; a CUDA graph replays the forward it captured "
            "with one launch. 'compile s' is the background compile of that one shape (Inductor, in-process cache "
            "only: the kept cache of a second start is not used here). The attention column is the profile of the "
            "forward each path's graphs capture, run outside the graph: the eager forward for eager and eager + "
            "graphs, the compiled forward for compiled + graphs (a replay is one launch whose kernels a profiler "
            "may not name, and profiling replays is where profilers and CUDA graphs have crashed together).")
    named = [r for r in results if r.get("attention_kernels") and r["attention_kernels"].get("names")]
    if named:
        ctx.say("\nAttention kernel names per path (device_bench.json: graphs[].attention_kernels):\n")
        for r in named:
            ctx.say(f"- {r['path']}, {r['task']} x{r['batch']} ({r['attention_kernels']['profiled']}): "
                    + "; ".join(n[:90] for n in r["attention_kernels"]["names"][:3]))


def _graph_rows(ctx: Ctx, paths, cases, models, classes, lane, eager_ms, results, profile: bool) -> None:
    for label, fastpath in paths:  # compiled last: a phase cut short keeps the eager and graph rows
        for task, batch in cases:
            if ctx.left_s() < (40 if "compiled" in label else 10):
                ctx.report.table_row([label, f"{task} x{batch}", None, None, None, None, None,
                                      f"skipped: {ctx.left_s():.0f} s left of this phase", None])
                continue
            est = classes[task](models[task], input_size=ctx.size, fastpath=fastpath)
            with _on(lane):
                # made on the lane that reads it (made on the default stream, the lane would not wait for it)
                pixels = torch.randn(batch, 3, *ctx.size, device=ctx.device)  # float32, as the engine's inputs
                t0 = time.perf_counter()
                for _ in range(2):  # as it is, then captured (and replayed)
                    _run(est, pixels)
                ctx.sync()
                warm_s = time.perf_counter() - t0
                compiled_s, in_use = None, True
                if fastpath.compile != "off":
                    in_use, compiled_s = _compiled(ctx, est, pixels, ctx.left_s() - 30)
                stats = ctx.measure(lambda: _run(est, pixels))
                kernels = None
                if profile:
                    what, forward = path_forward(est, pixels)
                    kernels = attention_kernels(ctx, forward)
                    kernels["profiled"] = what
            ms = stats.p50
            if label == "eager":
                eager_ms[(task, batch)] = ms
            base = eager_ms.get((task, batch))
            row = dict(path=label, task=task, batch=batch, ms=stats.samples_ms, warm_s=warm_s, compile_s=compiled_s,
                       compiled_in_use=in_use if fastpath.compile != "off" else None,
                       switched_off=est.switched_off, resolved=est.fastpath.describe(), attention_kernels=kernels)
            results.append(row)
            checks = "; ".join(f"{k} off: {v[:80]}" for k, v in est.switched_off.items()) or "all agreed"
            speed = "-" if base is None else f"{base / ms:.2f}x"
            ctx.report.table_row([label, f"{task} x{batch}", ms, stats.p95, speed,
                                  f"{warm_s:.1f}", "-" if compiled_s is None else f"{compiled_s:.1f}", checks,
                                  "-" if kernels is None else f"{kernels['summary']} ({kernels['profiled']})"])
            ctx.report.save()
            est.close()


def path_forward(est, pixels: torch.Tensor) -> tuple[str, Callable[[], object]]:
    """The forward an estimator's path runs for ``pixels``, to be called outside any CUDA graph: its
    compiled forward once that shape is compiled and in use, else its eager forward (the one its graphs
    capture). (what it is, a call of it under inference mode: the compiled forward's guards want it)."""
    forward = est._forward  # stages.sapiens2.forward.FastForward: what the estimator runs
    compiler = forward.compiler
    compiled = compiler.compiled_for(tuple(pixels.shape)) if compiler is not None else None
    x = pixels.contiguous()
    fn = compiled if compiled is not None and "compile" not in est.switched_off else forward.eager
    what = "compiled forward" if fn is compiled else "eager forward"

    def call() -> object:
        with torch.inference_mode():
            return fn(x)

    return what, call


def profiler_probe(ctx: Ctx) -> str | None:
    """One small profiled call: what the profiler reports here ("CUDA kernels", "CPU ops" in the smoke
    run), or None (said in the report) when it reports nothing or fails."""
    try:
        seen = kernel_times(lambda: torch.ones(1024, device=ctx.device).add_(1), ctx.device)
    except RuntimeError as exc:
        ctx.say(f"(the profiler failed here: {str(exc).strip().splitlines()[0][:200]}; no kernel names below)\n")
        return None
    if not seen:
        ctx.say("(the profiler reported no CUDA kernels here, CUPTI unavailable?: no kernel names below)\n")
        return None
    return "CUDA kernels" if ctx.cuda else "CPU ops"


def attention_kernels(ctx: Ctx, fn: Callable[[], object]) -> dict[str, Any]:
    """The attention kernels one call of ``fn`` runs, grouped by backend: flash, efficient (memory-
    efficient/cutlass fmha), cudnn, math (matmul + softmax). CUDA kernel names from the profiler on a
    GPU; on the CPU (the smoke run) the aten ops, which name the CPU's attention kernels the same way."""
    names = kernel_times(fn, ctx.device)
    found: dict[str, float] = {}
    for name, ms in names.items():
        kind = attention_backend(name)
        if kind is not None:
            found[kind] = found.get(kind, 0.0) + ms
    summary = ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(found.items(), key=lambda kv: -kv[1])) or \
        ("none seen" if names else "the profiler saw nothing")
    return dict(summary=summary, by_backend=found, kernels_seen=len(names),
                names=sorted(n for n in names if attention_backend(n) is not None)[:12])


def attention_backend(kernel: str) -> str | None:
    name = kernel.lower()
    if "flash" in name:
        return "flash"
    if "cudnn" in name and ("sdpa" in name or "attn" in name or "fmha" in name):
        return "cudnn"
    if "fmha" in name or "efficient_attention" in name or "mem_eff" in name:
        return "efficient"
    if "softmax" in name:
        return "math (softmax)"
    return None


def kernel_times(fn: Callable[[], object], device: torch.device | str = "cuda") -> dict[str, float]:
    """Milliseconds of GPU time per CUDA kernel name in one call of ``fn`` (after one warm call); on a
    CPU device, CPU milliseconds per op (self time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        sync(device)
    times: dict[str, float] = {}
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for event in prof.events():
        if event.device_type == kind:
            us = event.device_time_total if cuda else event.self_cpu_time_total
            times[event.name] = times.get(event.name, 0.0) + us / 1000.0
    return times


KERNEL_KINDS = (("attention", lambda n: attention_backend(n) is not None and "softmax" not in n.lower()),
                ("GEMM", lambda n: any(k in n.lower() for k in ("gemm", "xmma", "cutlass", "sm90", "matmul"))),
                ("convolution", lambda n: any(k in n.lower() for k in ("conv", "implicit", "winograd", "dgrad",
                                                                        "wgrad", "fft"))),
                ("norm (rms/instance/batch)", lambda n: "norm" in n.lower()),
                ("RoPE/elementwise", lambda n: any(k in n.lower() for k in ("elementwise", "vectorized", "roll",
                                                                           "copy", "cat", "unrolled"))),
                ("reduction", lambda n: "reduce" in n.lower()))


def kernel_breakdown(times: dict[str, float]) -> dict[str, float]:
    """GPU milliseconds by kind of kernel (first matching kind of KERNEL_KINDS, else other)."""
    out: dict[str, float] = {}
    for name, ms in times.items():
        kind = next((k for k, match in KERNEL_KINDS if match(name)), "other")
        out[kind] = out.get(kind, 0.0) + ms
    return out


def _on(stream: Any) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def phase_compile(ctx: Ctx) -> None:
    """The lanes with a compiled pose stage (compiled + CUDA graphs on its lane, as --compile runs it):
    whether the detector and seg still run beside it."""
    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.sapiens2.fastpath import FastPath

    mode = "default"
    ctx.say(f"\n## Streams with a compiled pose stage (compile {mode} + CUDA graphs), {ctx.model('0.4b')}, "
            f"{ctx.precision}, 4 persons\n")
    model = load_model(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype)
    compiled = PoseEstimator(model, input_size=ctx.size, fastpath=FastPath(compile=mode))
    seg = Segmenter(ctx.ckpt("seg"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    h, w = ctx.frame
    detector = TimedDetector(ctx, person_boxes(4, w, h))
    engine = FrameEngine(Stages(ctx.device, detector, {"pose": compiled, "seg": seg}))
    with torch.inference_mode(), engine.streams.use("pose"), smoke_compile(ctx):  # where the engine replays it
        crops = torch.randn(4, 3, *ctx.size, device=ctx.device)
        _run(compiled, crops)
        ctx.say(f"compiling pose x4 in the background ({ctx.left_s():.0f} s left before the watchdog) ...")
        ready, seconds = _compiled(ctx, compiled, crops, ctx.left_s() - 40)
    ctx.report.results["compile"] = dict(mode=mode, ready=ready, compile_s=seconds, switched_off=compiled.switched_off)
    state = f"compiled in {seconds:.1f} s and in use" if ready else \
        f"not in use: {compiled.switched_off or 'not compiled in time'}"
    ctx.say(f"pose x4: {state}")
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
    (the only one fixed boxes reach: the engine's warm_up would capture every bucket below it too)
    and the dense stages at one frame."""
    from stages.sapiens2.fastpath import bucket

    pose = engine.stages.estimators["pose"]
    with torch.inference_mode(), engine.streams.use("pose"):
        crops = torch.zeros(bucket(persons), 3, *pose.input_size, device=pose.device)  # float32, as crops are
        for _ in range(2 if pose.fastpath.graphs else 1):  # as it is, then captured
            pose.infer(crops, persons)
    for task, est in engine.stages.estimators.items():
        if task != "pose":
            with engine.streams.use(TASKS[task].stream):
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
