"""One-call GPU benchmark: correctness in bf16/fp16, model speed vs the bf16 peak, our path vs the
reference, end-to-end pipeline FPS and capture-to-publish latency, overlap gain, every fast-path
switch on and off, peak memory.

Runs within ~8 minutes on one H200 (bench/device_run.sh installs the carried wheels first and
calls this). Phases run in order of importance, each isolated: a phase that fails is reported with
its error and the next one runs; the report is rewritten after every phase, so a run cut short
still leaves what it measured; a phase that would overrun the time budget is skipped and says so.
``--smoke`` runs every phase on tiny configs on the CPU, so the script itself is tested where no
GPU is. Results: a markdown report on stdout and in OUT/device_bench.md, all numbers in
OUT/device_bench.json.

    python bench/device_bench.py --out $OUT            # on the GPU machine
    python bench/device_bench.py --smoke --out /tmp/x  # anywhere, tiny configs on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import measure  # noqa: E402
from stages.sapiens2.config import variant  # noqa: E402
from stages.sapiens2.model import Sapiens2  # noqa: E402
from stages.sapiens2.tiny import random_init, tiny_config, write_checkpoint  # noqa: E402
from stages.sapiens2.weights import load_model  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.5  # NVIDIA's spec sheet figure for dense bf16 (no sparsity)


class Report:
    """Markdown lines and a JSON tree, both written to OUT after every phase."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.results: dict[str, Any] = {"errors": {}, "skipped": [], "phase_seconds": {}}

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.say("| " + " | ".join(header) + " |")
        self.say("|" + "---|" * len(header))
        for row in rows:
            self.say("| " + " | ".join(_cell(v) for v in row) + " |")

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "device_bench.md").write_text("\n".join(self.lines) + "\n")
        (self.out / "device_bench.json").write_text(json.dumps(self.results, indent=1, default=str))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


@dataclass
class Ctx:
    """What every phase needs: where, at which precision, how long, and the checkpoints."""

    device: torch.device
    smoke: bool
    iters: int
    seconds: float
    deadline: float
    report: Report
    ckpts: dict[str, Path] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:  # the run's precision: bf16 on the GPU, fp32 for the CPU smoke run
        return torch.bfloat16 if self.cuda else torch.float32

    @property
    def size(self) -> tuple[int, int]:  # model input (pose crops and dense frames)
        return (256, 192) if self.smoke else (1024, 768)

    @property
    def frame(self) -> tuple[int, int]:
        return (240, 320) if self.smoke else (1080, 1920)

    def say(self, line: str = "") -> None:
        self.report.say(line)

    def model(self, size: str) -> str:
        """How a report names a model: its published size, or "tiny" in the smoke run."""
        return "tiny" if self.smoke else size

    @property
    def precision(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def ms(self, fn: Callable[[], object], warmup: int = 3, iters: int | None = None) -> list[float]:
        """Per-call milliseconds (CUDA events on a GPU, wall clock on the CPU), warm-up excluded."""
        return measure(fn, iters or self.iters, warmup, self.device).samples_ms

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def p50(samples: list[float]) -> float:
    return float(statistics.median(samples))


def p95(samples: list[float]) -> float:
    return float(np.percentile(samples, 95))


def wall_ms(fn: Callable[[], object], iters: int, warmup: int = 3) -> list[float]:
    """Wall-clock milliseconds per call: for host-side costs (a blocking copy, an encoder)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def run_phase(ctx: Ctx, name: str, fn: Callable[[Ctx], None], needs_s: float) -> None:
    """Run one phase in isolation: skipped when the budget is short, its failure reported, not fatal."""
    report = ctx.report
    left = ctx.deadline - time.perf_counter()
    if left < needs_s:
        report.say(f"\n(phase `{name}` skipped: {left:.0f} s of the time budget left, it needs about {needs_s:.0f} s)")
        report.results["skipped"].append(name)
        report.save()
        return
    t0 = time.perf_counter()
    try:
        fn(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken phase must not cost the others' numbers
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        report.say(f"\n**phase `{name}` failed**: {type(exc).__name__}: {first[:300]}")
        report.results["errors"][name] = trace
    finally:
        report.results["phase_seconds"][name] = round(time.perf_counter() - t0, 1)
        report.say(f"\n_(phase `{name}`: {time.perf_counter() - t0:.0f} s)_")
        report.save()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()


# -- checkpoints ---------------------------------------------------------------------------------
def make_checkpoints(ctx: Ctx, root: Path) -> None:
    """Real-size random-weight checkpoints in the published layout, read back by our loader."""
    for task, size in (("pose", "0.4b"), ("seg", "0.4b"), ("matting", "1b")):
        cfg = tiny_config(task) if ctx.smoke else variant(task, size, fuse_qkv=False)
        t0 = time.perf_counter()
        model = random_init(Sapiens2(cfg), seed=1)
        ctx.ckpts[task] = write_checkpoint(model, root / task)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        ctx.say(f"- wrote random {task} {'tiny' if ctx.smoke else size} checkpoint ({params:.0f} M parameters) "
                f"in {time.perf_counter() - t0:.1f} s")
        del model


# -- phases --------------------------------------------------------------------------------------
@contextlib.contextmanager
def strict_float32():
    """True float32 matmuls and convolutions (cuDNN convolutions default to TF32 on CUDA)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def phase_correctness(ctx: Ctx) -> None:
    ctx.say("\n## Correctness on the device (bf16 / fp16 vs float32, TF32 off, on the same device)\n")
    rows = []
    ctx.report.results["correctness"] = []
    gen = torch.Generator().manual_seed(0)
    for task in ("pose", "seg", "matting"):
        x = torch.randn(2, 3, *ctx.size, generator=gen).to(ctx.device)
        with torch.inference_mode(), strict_float32():
            ref = load_model(ctx.ckpts[task], device=ctx.device, dtype="float32")(x)[0].float()
        for dtype in ("bfloat16", "float16"):
            model = load_model(ctx.ckpts[task], device=ctx.device, dtype=dtype)
            with torch.inference_mode():
                out = model(x)[0].float()
            finite = bool(torch.isfinite(out).all())
            rel = float((out - ref).norm() / ref.norm())
            mx = float((out - ref).abs().max() / ref.abs().max())
            ctx.report.results["correctness"].append(dict(task=task, dtype=dtype, rel_l2=rel, max_rel=mx, finite=finite))
            rows.append([task, dtype, f"{rel:.2e}", f"{mx:.2e}", finite])
            del model
        del ref
    ctx.report.table(["task", "dtype", "rel. L2 error", "max abs err / max abs", "finite"], rows)


def backbone_macs(cfg, h: int, w: int) -> tuple[float, float]:
    """Multiply-accumulates of one backbone forward at h x w: (projections + MLP + patch embed,
    attention's QK^T and AV)."""
    tokens = (h // cfg.patch_size) * (w // cfg.patch_size) + cfg.num_prefix_tokens
    d, hd = cfg.hidden_size, cfg.head_dim
    linear = (h // cfg.patch_size) * (w // cfg.patch_size) * 3 * cfg.patch_size ** 2 * d
    attention = 0
    for kv in cfg.num_key_value_heads_per_layer:
        linear += tokens * (2 * d * d + 2 * d * kv * hd)  # q, o, k, v projections
        linear += tokens * 3 * d * cfg.intermediate_size  # SwiGLU
        attention += 2 * tokens * tokens * d  # QK^T and AV
    return float(linear), float(attention)


def phase_forward(ctx: Ctx) -> None:
    ctx.say(f"\n## Model forward, pose {ctx.model('0.4b')}, {ctx.precision} (CUDA events, warm-up excluded)\n")
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    n = 256 if ctx.smoke else 8192
    a, b = (torch.randn(n, n, device=ctx.device, dtype=ctx.dtype) for _ in range(2))
    gemm = 2 * n ** 3 / (p50(ctx.ms(lambda: a @ b, warmup=100)) / 1000) / 1e12  # long warm-up: clocks ramp
    del a, b
    model = load_model(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype)
    linear, attention = backbone_macs(model.cfg, *ctx.size)
    macs = linear + attention
    ctx.say(f"backbone at {ctx.size[0]}x{ctx.size[1]}: {macs / 1e12:.2f} T MAC per forward = {linear / 1e12:.2f} T in "
            f"projections, MLP and patch embedding (the issue's 1.26 T counts about these) + {attention / 1e12:.2f} T "
            "in attention (QK^T, AV); the fractions below count all of it")
    ctx.say(f"bf16 dense peak: {H200_BF16_DENSE_TFLOPS} TFLOP/s (spec sheet); a {n}^3 GEMM measures {gemm:.0f} "
            "TFLOP/s here\n")
    rows = []
    ctx.report.results["forward"] = []
    ctx.report.results["gemm_tflops"] = gemm
    for batch in (1, 2, 4, 8):
        x = torch.randn(batch, 3, *ctx.size, device=ctx.device)
        with torch.inference_mode():
            bb = ctx.ms(lambda: model.backbone.forward_features(x), warmup=5)
            full = ctx.ms(lambda: model(x), warmup=2)
        tflops = 2 * macs * batch / (p50(bb) / 1000) / 1e12
        row = dict(batch=batch, backbone_ms=bb, full_ms=full, tflops=tflops,
                   peak_fraction=tflops / H200_BF16_DENSE_TFLOPS, gemm_fraction=tflops / gemm)
        ctx.report.results["forward"].append(row)
        rows.append([batch, p50(bb), p95(bb), f"{tflops:.0f}", f"{100 * row['peak_fraction']:.0f}%",
                     f"{100 * row['gemm_fraction']:.0f}%", p50(full), batch * 1000 / p50(full)])
    ctx.report.table(["persons (batch)", "backbone ms p50", "p95", "TFLOP/s", "% of bf16 dense peak",
                      "% of measured GEMM", "full pose forward ms p50", "persons/s"], rows)
    if ctx.cuda:
        ctx.report.results["forward_peak_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30


def phase_reference(ctx: Ctx) -> None:
    """Our stages vs the reference path (transformers processor + model + post-processing) at the
    same precision, same weights, same inputs: bench_stages' groups, on this device."""
    import transformers
    from transformers import Sapiens2ImageProcessor

    from bench import bench_stages as bs

    config = "tiny" if ctx.smoke else "0.4b"
    ctx.say(f"\n## Our path vs the reference (transformers {transformers.__version__}), "
            f"{ctx.precision}, config {config}, frame {ctx.frame[0]}x{ctx.frame[1]}\n")
    args = argparse.Namespace(persons=[1, 4, 8], iters=ctx.iters, warmup=3, wait_quiet=0)
    bench = bs.Bench(args, ctx.device, ctx.dtype)
    h_in, w_in = bs.CONFIGS[config]["arch"]["image_size"]
    proc = Sapiens2ImageProcessor(size={"height": h_in, "width": w_in})
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (*ctx.frame, 3), dtype=np.uint8)
    pairs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in ("pose", "seg"):
            ref, ours = bs.build_pair(task, config, Path(tmp) / task, ctx.device, ctx.dtype)
            pairs[task] = (ref, ours)
            with torch.inference_mode():
                if task == "pose":
                    bs.bench_pose(bench, ref, ours, proc, image, rng)
                else:
                    bs.bench_dense(bench, task, ref, ours, proc, image)
        with torch.inference_mode():
            bs.bench_engine(bench, pairs, proc, image, rng)
    ctx.report.results["reference"] = bench.rows
    rows = [[r["stage"], r["path"], r["ours p50"], r["ours p95"], r["ours /s"], r["ref p50"], r["ref /s"],
             None if r["ours/ref"] is None else f"{1 / r['ours/ref']:.2f}x"] for r in bench.rows]
    ctx.report.table(["stage", "path", "ours ms p50", "ours p95", "ours /s", "ref ms p50", "ref /s",
                      "speed-up (ref/ours)"], rows)
    ctx.say("\n/s: persons per second for pose, frames per second otherwise. \"image -> host result\" is numpy "
            "in, numpy out for both; the frame rows run pose (2 persons) + seg through our FrameEngine vs the "
            "two reference paths in sequence.")


class FixedBoxes:
    """Detector stand-in: N fixed person boxes, so pose runs on a known person count."""

    random_weights = False

    def __init__(self, n: int, width: int, height: int) -> None:
        from stages.types import Detections

        step = width // (n + 1)
        boxes = np.array([[step * (i + 1) - 0.08 * width, height * 0.1, step * (i + 1) + 0.08 * width, height * 0.95]
                          for i in range(n)], np.float32)
        self.detections = Detections(boxes, np.full(n, 0.9, np.float32), np.arange(n))

    def detect(self, image: np.ndarray):
        return self.detections

    def carry(self, boxes) -> None:
        pass

    def reset(self) -> None:
        pass


class YoloThenFixedBoxes(FixedBoxes):
    """The real YOLO detector runs on every frame (random weights: its cost is real, its boxes are
    not), then the N fixed boxes are returned."""

    random_weights = True

    def __init__(self, yolo, n: int, width: int, height: int) -> None:
        super().__init__(n, width, height)
        self.yolo = yolo

    def detect(self, image: np.ndarray):
        self.yolo.detect(image)
        return self.detections


def _yolo(ctx: Ctx):
    """A random-init YOLO11n person detector on the device, or None (and why) when Ultralytics is missing."""
    from stages.detector import DetectorError, PersonDetector

    try:
        return PersonDetector("yolo11n.yaml", device="cuda:0" if ctx.cuda else "cpu", half=ctx.cuda), ""
    except DetectorError as exc:
        return None, str(exc)


class AlreadyOpen:
    """Sink wrapper for a publisher opened early (so a subscriber can join before frames flow)."""

    def __init__(self, sink) -> None:
        self.sink = sink

    def open(self, info) -> None:
        pass

    def write(self, result) -> None:
        self.sink.write(result)

    def close(self) -> None:
        self.sink.close()


def phase_pipeline(ctx: Ctx) -> None:
    from pipeline.demo_source import SyntheticCamera
    from pipeline.engine import FrameEngine
    from pipeline.publisher import ZmqPublisher
    from pipeline.runner import Runner
    from pipeline.sources import Source
    from pipeline.stages_setup import Stages
    from pipeline.subscriber import ReceiveTimeout, Subscriber
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.sapiens2.fastpath import warmup

    h, w = ctx.frame
    yolo, why = _yolo(ctx)
    detector = f"YOLO11n (random weights{', fp16' if yolo and yolo.half else ''}) on every frame, then N fixed boxes" if yolo else \
        f"N fixed boxes, no detector ({why})"
    ctx.say(f"\n## End to end: synthetic live {h}p camera -> detector -> pose + seg -> ZeroMQ -> subscriber\n")
    ctx.say(f"pose and seg {ctx.model('0.4b')}, {ctx.precision}, inputs {ctx.size[0]}x{ctx.size[1]}; detector: "
            f"{detector}; {ctx.seconds:.0f} s per row; latency = subscriber receive time - capture time of the "
            "keypoints message and FPS = rate of those messages, first 10% dropped as warm-up; the camera delivers up to 240 fps and drops frames the "
            "pipeline has no time for (it never queues them).\n")
    pose = PoseEstimator(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    seg = Segmenter(ctx.ckpts["seg"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    warmup(pose, 4)
    warmup(seg)
    if yolo is not None:
        yolo.detect(np.zeros((h, w, 3), np.uint8))
    rows = []
    ctx.report.results["pipeline"] = []
    for persons, overlap, pinned in ((1, True, True), (1, False, True), (2, True, True), (4, True, True),
                                     (4, False, True), (1, True, False)):
        if time.perf_counter() + ctx.seconds + 5 > ctx.deadline:
            ctx.say(f"(row {persons} persons overlap={overlap} pinned={pinned} skipped: time budget)")
            continue
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        det = YoloThenFixedBoxes(yolo, persons, w, h) if yolo is not None else FixedBoxes(persons, w, h)
        stages = Stages(ctx.device, det, {"pose": pose, "seg": seg})
        camera = SyntheticCamera(width=w, height=h, fps=240.0)
        source = Source(camera.open, label="synthetic", source_id="bench", live=True)
        publisher = ZmqPublisher("tcp://127.0.0.1:*", sndhwm=64)
        latencies: list[float] = []
        received: list[float] = []  # receive times (s) of the keypoints messages
        stop = threading.Event()
        engine = FrameEngine(stages, overlap=overlap, pinned=pinned)
        runner = Runner(source, engine, [AlreadyOpen(publisher)], None, False, stop=stop, pipelined=overlap)

        def listen() -> None:
            with Subscriber(publisher.endpoint, ["keypoints"]) as sub:
                while not stop.is_set():
                    try:
                        msg = sub.recv(timeout_s=0.2)
                    except ReceiveTimeout:
                        continue
                    now = time.time_ns()
                    latencies.append((now - msg.meta.capture_ns) / 1e6)
                    received.append(now / 1e9)

        listener = threading.Thread(target=listen, daemon=True)
        timer = threading.Timer(ctx.seconds, stop.set)
        source.open()
        publisher.open(source.info)  # bind now so the subscriber can join before frames flow
        listener.start()
        publisher.wait_for_subscriber("keypoints.bench", 5)
        timer.start()
        t0 = time.perf_counter()
        stats = runner.run()
        elapsed = time.perf_counter() - t0
        timer.cancel()
        stop.set()
        listener.join(2)
        if stats.error is not None:
            raise stats.error
        skip = len(latencies) // 10  # warm-up
        lat, times = latencies[skip:], received[skip:]
        # The rate of published results over the kept window (start-up and shut-down excluded).
        fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
        row = dict(persons=persons, overlap=overlap, pinned=pinned, frames=stats.frames, fps=fps,
                   fps_overall=stats.frames / elapsed,
                   p50_ms=float(np.percentile(lat, 50)) if lat else None,
                   p95_ms=float(np.percentile(lat, 95)) if lat else None, drops=source.frames_dropped,
                   peak_gib=torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.cuda else None)
        ctx.report.results["pipeline"].append(row)
        rows.append([persons, "yes" if overlap else "no (one stream, serialised)",
                     "yes" if pinned else "no (pageable: the host waits for each stage's copy)",
                     row["fps"], row["p50_ms"], row["p95_ms"], row["drops"], row["peak_gib"]])
    ctx.report.table(["persons", "stages overlapped", "pinned copies", "FPS", "capture->publish p50 ms", "p95 ms",
                      "camera frames dropped", "peak GPU GiB"], rows)


REPO = Path(__file__).resolve().parents[1]
OUR_CODE = (str(REPO / "stages"), str(REPO / "pipeline"))


def sync_sites(fn: Callable[[], object], ours: tuple[str, ...] = OUR_CODE) -> dict[str, int]:
    """Run fn; for every synchronisation warning it raises (torch.cuda.set_sync_debug_mode("warn")
    emits one per synchronising call), the innermost line of our code on the stack, counted."""
    import warnings

    sites: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(ours)]
        where = f"{Path(frames[-1].filename).relative_to(REPO)}:{frames[-1].lineno}" if frames else \
            f"{Path(filename).name}:{lineno} (outside our code)"
        sites[where] = sites.get(where, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        fn()
    return sites


def phase_syncs(ctx: Ctx) -> None:
    """Host synchronisations while the engine queues a frame (pose + seg): each one stalls the host
    until a stream drains, so the next frame cannot be queued and the stages stop overlapping."""
    from pipeline.engine import FrameEngine
    from pipeline.stages_setup import Stages
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.types import Frame

    ctx.say("\n## Host synchronisations in FrameEngine.submit (pose 2 persons + seg)\n")
    if not ctx.cuda:
        ctx.say("needs CUDA (torch.cuda.set_sync_debug_mode); skipped in the smoke run")
        return
    h, w = ctx.frame
    pose = PoseEstimator(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    seg = Segmenter(ctx.ckpts["seg"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    engine = FrameEngine(Stages(ctx.device, FixedBoxes(2, w, h), {"pose": pose, "seg": seg}))
    image = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    engine.finish(engine.submit(Frame(0, image, None, None, time.time_ns())), True)  # warm: constants made
    pendings: list = []

    def submit_three() -> None:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pendings.extend(engine.submit(Frame(i, image, None, None, time.time_ns())) for i in (1, 2, 3))
        finally:
            torch.cuda.set_sync_debug_mode("default")

    sites = sync_sites(submit_three)
    for pending in pendings:
        engine.finish(pending, True)
    ctx.report.results["syncs"] = sites
    ctx.say(f"{sum(sites.values())} synchronising calls in 3 submits" + (":" if sites else " (none)"))
    for site, count in sorted(sites.items(), key=lambda kv: -kv[1]):
        ctx.say(f"- {site}: {count}")


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
    boxes = FixedBoxes(4, w, h).detections.boxes
    fused = load_model(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype)

    def estimator(model=fused, **kwargs) -> Callable[[], PoseEstimator]:
        return lambda: PoseEstimator(model, input_size=ctx.size, **kwargs)

    default = estimator()()
    with torch.inference_mode():
        image_t = default.image_tensor(image)
        boxes_t = torch.as_tensor(boxes, device=ctx.device)
        crops = default.preprocess(image_t, boxes_t)
        crops3 = default.preprocess(image_t, boxes_t[:3])  # 3 persons, padded to a batch of 4
    _, base, base_ms = _ablation_row(ctx, rows, "default", lambda: default, crops, 4, None, None)
    unfused = load_model(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype, fuse_qkv=False)
    _ablation_row(ctx, rows, "QKV projections unfused", estimator(unfused), crops, 4, base, base_ms)
    del unfused
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
    ctx.report.table(["variant", "resolved options", "batch", "ms p50", "p95", "speed vs default", "max |diff| / max"],
                     rows)
    ctx.say("\nSpeed and difference are against the row marked default above each; \"resolved\" shows what ran "
            "(a backend that cannot run here falls back to auto, with a warning in the log). Buckets exist so "
            "1-8 persons need 4 shapes (1/2/4/8) instead of 8 for cuDNN autotuning and compiled graphs.")


def phase_transfers(ctx: Ctx) -> None:
    """Pinned vs pageable copies, GPU vs CPU JPEG, hardware vs software video encoding."""
    import cv2

    from pipeline.publisher import JpegEncoder
    from pipeline.recorder import VideoRecorder
    from pipeline.sinks import StreamInfo
    from stages.sapiens2.preprocess import to_device_image
    from stages.types import Frame, FrameResult

    h, w = ctx.frame
    # Camera-like content (smooth shading and blurred texture): pure noise would make the codecs
    # unrepresentatively slow.
    noise = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    ramp = np.linspace(0, 160, w, dtype=np.float32)[None, :, None]
    image = np.clip(ramp + 0.4 * cv2.GaussianBlur(noise, (0, 0), 3).astype(np.float32), 0, 255).astype(np.uint8)
    ctx.say(f"\n## Transfers and encoders, one {h}x{w} frame (wall clock per call, host and device finished)\n")
    rows = []
    results = ctx.report.results.setdefault("transfers", [])

    def add(what: str, variant: str, samples: list[float], note: str = "") -> None:
        results.append(dict(what=what, variant=variant, ms=samples, note=note))
        rows.append([what, variant, p50(samples), p95(samples), note])

    for pinned in (True, False):
        def upload() -> None:
            to_device_image(image, ctx.device, pinned)
            ctx.sync()

        add("frame upload (H2D)", "pinned staging" if pinned else "pageable", wall_ms(upload, ctx.iters))
    seg_map = torch.randint(0, 29, (h, w), dtype=torch.uint8, device=ctx.device)
    host = torch.empty(seg_map.shape, dtype=torch.uint8, pin_memory=ctx.cuda)

    def download_pinned() -> None:
        host.copy_(seg_map, non_blocking=True)
        ctx.sync()

    add("seg map download (D2H)", "pinned buffer", wall_ms(download_pinned, ctx.iters))
    add("seg map download (D2H)", "pageable", wall_ms(lambda: seg_map.cpu(), ctx.iters))
    def fidelity(data: bytes | None) -> str:
        """Decode the JPEG and compare it with the frame: a wrong or torn encode shows here."""
        decoded = None if data is None else cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if decoded is None:
            return "does not decode"
        err = np.abs(cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB).astype(np.int16) - image).mean()
        return f"{len(data) / 1e3:.0f} kB, decodes; mean abs error {err:.2f}"

    def cpu_jpeg() -> bytes:  # what the publisher does without --gpu-jpeg
        return cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()

    gpu_jpeg = JpegEncoder(90, "auto")
    if gpu_jpeg.active:
        samples = wall_ms(lambda: gpu_jpeg.encode(image), ctx.iters)
        add("JPEG q90 of the frame", "GPU (nvJPEG)", samples,
            fidelity(gpu_jpeg.encode(image)) if gpu_jpeg.active else "failed, fell back to the CPU (see the log)")
    else:
        rows.append(["JPEG q90 of the frame", "GPU (nvJPEG)", None, None, "no CUDA device"])
    add("JPEG q90 of the frame", "CPU (OpenCV)", wall_ms(cpu_jpeg, ctx.iters), fidelity(cpu_jpeg()))
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("h264_nvenc", "libx264"):
            rec = VideoRecorder(Path(tmp) / f"{codec}.mp4", fps=30.0, codec=codec)
            rec.open(StreamInfo("bench", w, h, 30.0, Fraction(1, 30), False))
            counter = iter(range(1 << 30))

            def write() -> None:
                i = next(counter)
                rec.write(FrameResult(Frame(i, image, i, Fraction(1, 30), time.time_ns())))

            frames = max(ctx.iters, 60)
            samples = wall_ms(write, frames, warmup=5)
            t0 = time.perf_counter()
            rec.close()  # the encoder's buffered frames are flushed here: part of the per-frame cost
            per_frame = (sum(samples) + (time.perf_counter() - t0) * 1000.0) / frames
            used = rec.codec or "?"
            add("video encode per frame", f"{codec} requested", samples,
                f"encoder used: {used}" + ("" if used == codec else " (requested one unavailable here)")
                + f"; {per_frame:.1f} ms per frame with the final flush")
    ctx.report.table(["what", "variant", "ms p50", "p95", "note"], rows)


def phase_compile(ctx: Ctx) -> None:
    """torch.compile with CUDA graphs ("reduce-overhead"): its start-up cost and its per-call gain."""
    from stages.sapiens2.estimators import PoseEstimator
    from stages.sapiens2.fastpath import FastPath

    mode = "default" if ctx.smoke else "reduce-overhead"
    ctx.say(f"\n## torch.compile (mode {mode}), pose {ctx.model('0.4b')}, {ctx.precision}, 4 persons\n")
    model = load_model(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype)
    eager = PoseEstimator(model, input_size=ctx.size)
    compiled = PoseEstimator(model, input_size=ctx.size, fastpath=FastPath(compile=mode))
    crops = torch.randn(4, 3, *ctx.size, device=ctx.device).to(ctx.dtype)
    with torch.inference_mode():
        base = eager.infer(crops, 4).float()
        t0 = time.perf_counter()
        for _ in range(3):  # compile, record the graph, replay
            out = compiled.infer(crops, 4)
        ctx.sync()
        startup = time.perf_counter() - t0
        diff = float((out.float() - base).abs().max() / base.abs().max())
        eager_ms = ctx.ms(lambda: eager.infer(crops, 4))
        compiled_ms = ctx.ms(lambda: compiled.infer(crops, 4))
    from torch._dynamo.utils import counters

    # Inductor drops CUDA graphs silently for a graph it cannot capture; it counts each time it does.
    skips = int(counters["inductor"].get("cudagraph_skips", 0))
    ctx.report.results["compile"] = dict(mode=mode, startup_s=startup, eager_ms=eager_ms, compiled_ms=compiled_ms,
                                         max_rel_diff=diff, cudagraph_skips=skips)
    ctx.report.table(["path", "ms p50", "p95", "speed-up", "start-up (compile) s", "max |diff| / max"], [
        ["eager (default)", p50(eager_ms), p95(eager_ms), "-", "-", "-"],
        [f"compiled, {mode}", p50(compiled_ms), p95(compiled_ms), f"{p50(eager_ms) / p50(compiled_ms):.2f}x",
         f"{startup:.1f}", f"{diff:.1e}"],
    ])
    if mode == "reduce-overhead":
        ctx.say(f"\nCUDA graphs: {'used' if skips == 0 else f'SKIPPED {skips} time(s): this row is plain Inductor'}.")
    ctx.say("\nThe start-up cost is paid once per input shape (one shape here; a pipeline warms every pose "
            "bucket at start-up, `--compile` logs the total).")


PHASES: list[tuple[str, Callable[[Ctx], None], float]] = [  # name, function, seconds it needs (H200 estimate)
    ("correctness", phase_correctness, 20),
    ("forward", phase_forward, 20),
    ("syncs", phase_syncs, 10),
    ("reference", phase_reference, 90),
    ("pipeline", phase_pipeline, 75),
    ("fastpath", phase_fastpath, 30),
    ("transfers", phase_transfers, 15),
    ("compile", phase_compile, 120),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for device_bench.md / .json")
    ap.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (tests the script)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=8.0, help="per end-to-end configuration")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds from the start: a phase that would end after this is skipped")
    ap.add_argument("--phases", default=",".join(name for name, _, _ in PHASES))
    args = ap.parse_args()
    started = time.perf_counter()
    unknown = set(args.phases.split(",")) - {name for name, _, _ in PHASES}
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(n for n, _, _ in PHASES)}")
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    report = Report(Path(args.out))
    ctx = Ctx(device, args.smoke, 3 if args.smoke else args.iters, min(args.seconds, 3.0) if args.smoke else args.seconds,
              started + args.budget_s, report)
    name = torch.cuda.get_device_name() if ctx.cuda else "CPU (smoke run: tiny configs, numbers meaningless)"
    report.say(f"# device_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {name}, torch {torch.__version__}")
    report.say("\nAll Sapiens2 weights are random: speeds are real, outputs are not meaningful.\n")
    report.results["device"] = name
    report.results["torch"] = torch.__version__
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoints(ctx, Path(tmp))
        report.save()
        for phase, fn, needs in PHASES:
            if phase in args.phases.split(","):
                run_phase(ctx, phase, fn, 0 if args.smoke else needs)
    total = time.perf_counter() - started
    report.say(f"\ntotal {total:.0f} s; failed phases: {', '.join(report.results['errors']) or 'none'}; "
               f"skipped: {', '.join(report.results['skipped']) or 'none'}")
    report.save()
    return 1 if report.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
