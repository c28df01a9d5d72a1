"""Device benchmark phases about the stream: end to end through the pipeline, host syncs in the
engine, transfers and encoders."""

from __future__ import annotations

import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from bench.bench_stages import FixedDetector
from bench.devicekit import Ctx, p50, p95, sync_sites, wall_ms


def person_boxes(n: int, width: int, height: int) -> np.ndarray:
    """(N, 4) xyxy boxes of N people standing side by side across the frame."""
    step = width // (n + 1)
    return np.array([[step * (i + 1) - 0.08 * width, height * 0.1, step * (i + 1) + 0.08 * width, height * 0.95]
                     for i in range(n)], np.float32)


class YoloThenFixedBoxes(FixedDetector):
    """The real YOLO detector runs on every frame (random weights: its cost is real, its boxes are
    not), then the fixed boxes are returned, so pose runs on a known person count."""

    def __init__(self, yolo, boxes: np.ndarray) -> None:
        super().__init__(boxes)
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
    from pipeline.engine import FrameEngine
    from pipeline.runner import Runner
    from pipeline.sinks.publisher import ZmqPublisher
    from pipeline.sources import Source
    from pipeline.sources.demo import SyntheticCamera
    from pipeline.stages_setup import Stages
    from sapiens2_client.subscriber import ReceiveTimeout, Subscriber
    from stages.sapiens2.estimators import PoseEstimator, Segmenter

    h, w = ctx.frame
    yolo, why = _yolo(ctx)
    if yolo is not None:
        detector = f"YOLO11n (random weights{', fp16' if yolo.half else ''}) on every frame, then N fixed boxes"
    else:
        detector = f"N fixed boxes, no detector ({why})"
    ctx.say(f"\n## End to end: synthetic live {h}p camera -> detector -> pose + seg -> ZeroMQ -> subscriber\n")
    ctx.say(f"pose and seg {ctx.model('0.4b')}, {ctx.precision}, inputs {ctx.size[0]}x{ctx.size[1]}; detector: "
            f"{detector}; {ctx.seconds:.0f} s per row; latency = subscriber receive time - capture time of the "
            "keypoints message and FPS = rate of those messages, first 10% dropped as warm-up; the camera "
            "delivers up to 240 fps and drops frames the pipeline has no time for (it never queues them).\n")
    pose = PoseEstimator(ctx.ckpts["pose"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    seg = Segmenter(ctx.ckpts["seg"], device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    pose.warmup(4)
    seg.warmup()
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
        boxes = person_boxes(persons, w, h)
        det = YoloThenFixedBoxes(yolo, boxes) if yolo is not None else FixedDetector(boxes)
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
    engine = FrameEngine(Stages(ctx.device, FixedDetector(person_boxes(2, w, h)), {"pose": pose, "seg": seg}))
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


def phase_transfers(ctx: Ctx) -> None:
    """Pinned vs pageable copies, GPU vs CPU JPEG, hardware vs software video encoding."""
    import cv2

    from pipeline.sinks.publisher import JpegEncoder
    from pipeline.sinks.recorder import VideoRecorder
    from stages.sapiens2.preprocess import to_device_image
    from stages.types import Frame, FrameResult, StreamInfo

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
