"""Device benchmark phases about the stream: end to end through the pipeline, host syncs in the
engine, transfers and encoders."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from bench.bench_stages import FixedDetector
from bench.devicekit import Ctx, sync_sites
from bench.harness import Stats, measure, percentile


def person_boxes(n: int, width: int, height: int) -> np.ndarray:
    """(N, 4) xyxy boxes of N people standing side by side across the frame."""
    step = width // (n + 1)
    return np.array([[step * (i + 1) - 0.08 * width, height * 0.1, step * (i + 1) + 0.08 * width, height * 0.95]
                     for i in range(n)], np.float32)


def camera_like_frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    """(H, W, 3) uint8 RGB with smooth shading and blurred texture: pure noise would make codecs
    unrepresentatively slow and model outputs unrepresentatively flat."""
    import cv2

    noise = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    ramp = np.linspace(0, 160, w, dtype=np.float32)[None, :, None]
    return np.clip(ramp + 0.4 * cv2.GaussianBlur(noise, (0, 0), 3).astype(np.float32), 0, 255).astype(np.uint8)


class YoloThenFixedBoxes(FixedDetector):
    """The real YOLO detector runs on every frame (random weights: its cost is real, its boxes are
    not), then the fixed boxes are returned, so pose runs on a known person count. The engine calls
    ``detect_tensors`` with the uploaded frames (one detector forward per step, letterboxed on the
    device), as it does the real detector's."""

    def __init__(self, yolo, boxes: np.ndarray) -> None:
        super().__init__(boxes)
        self.yolo = yolo
        self.calls = 0

    def detect(self, image: np.ndarray):
        return self.detect_batch([image])[0]

    def detect_batch(self, images: list[np.ndarray]):
        self.yolo.detect_batch(images)
        self.calls += 1
        return [self.detections for _ in images]

    def detect_tensors(self, images: list[torch.Tensor]):
        self.yolo.detect_tensors(images)
        self.calls += 1
        return [self.detections for _ in images]


class _Count(logging.Handler):
    """Counts Ultralytics log records that mention a deprecation (e.g. its ``half`` argument)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first = ""

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.count += 1
            self.first = self.first or record.getMessage()


def _yolo(ctx: Ctx):
    """A random-init YOLO11n person detector on the device, or None (and why) when Ultralytics is missing.

    ``half`` is PersonDetector's own argument: on CUDA it asks Ultralytics for ``quantize=16``;
    nothing here passes the deprecated ``half`` to Ultralytics itself."""
    from stages.detect import DetectorError
    from stages.detect.yolo import PersonDetector

    try:
        return PersonDetector("yolo11n.yaml", device=str(ctx.device), half=ctx.cuda), ""
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


# A row runs its seconds, and longer (up to MIN_RESULTS_WAIT_S more) until MIN_RESULTS keypoint messages
# came: two give a rate; on a loaded CPU the smoke run's short rows may see fewer.
MIN_RESULTS, MIN_RESULTS_WAIT_S = 3, 60.0
PIPELINE_ROWS = ((1, True, True), (1, False, True), (2, True, True), (4, True, True), (4, False, True),
                 (1, True, False))  # persons, stages overlapped, pinned copies


def phase_pipeline(ctx: Ctx) -> None:
    from sapiens2_client.subscriber import ReceiveTimeout, Subscriber

    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from pipeline.run.runner import Runner
    from pipeline.sinks.publisher import ZmqPublisher
    from pipeline.sources import Source
    from pipeline.sources.demo import SyntheticCamera
    from stages.sapiens2.estimators import PoseEstimator, Segmenter

    h, w = ctx.frame
    deprecations = _Count()
    logging.getLogger("ultralytics").addHandler(deprecations)
    try:
        yolo, why = _yolo(ctx)
        if yolo is not None:
            detector = f"YOLO11n (random weights{', fp16 (quantize=16)' if yolo.half else ''}) on every frame, " \
                       "then N fixed boxes"
        else:
            detector = f"N fixed boxes, no detector ({why})"
        ctx.say(f"\n## End to end: synthetic live {h}p camera -> detector -> pose + seg -> ZeroMQ -> subscriber\n")
        ctx.say(f"pose and seg {ctx.model('0.4b')}, {ctx.precision}, inputs {ctx.size[0]}x{ctx.size[1]}; detector: "
                f"{detector}; {ctx.seconds:.0f} s per row; latency = subscriber receive time - capture time of the "
                "keypoints message and FPS = rate of those messages, first 10% dropped as warm-up; the camera "
                "delivers up to 240 fps and drops frames the pipeline has no time for (it never queues them).\n")
        pose = PoseEstimator(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
        seg = Segmenter(ctx.ckpt("seg"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
        t0 = time.monotonic()
        # Every shape the rows reach, each stage on the stream that runs it (the lanes of a device are
        # shared by its engines) and on this thread, which runs the rows' Runner too: pose buckets up
        # to the most persons of a row, 1 frame, the detector on a frame uploaded as the engine does.
        most = max(persons for persons, _, _ in PIPELINE_ROWS)
        warm = FrameEngine(Stages(ctx.device, FixedDetector(person_boxes(1, w, h)), {"pose": pose, "seg": seg}))
        warm.warm_up(max_persons=most, max_frames=1)
        if yolo is not None:
            from stages.sapiens2.preprocess import to_device_image

            yolo.detect_tensors([to_device_image(np.zeros((h, w, 3), np.uint8), ctx.device)])
        ctx.say(f"warm-up (every pose bucket up to {most}, seg, the detector): {time.monotonic() - t0:.1f} s\n")
        rows = []
        results = ctx.report.results["pipeline"] = []
        for persons, overlap, pinned in PIPELINE_ROWS:
            if time.monotonic() + ctx.seconds + 5 > ctx.deadline:
                ctx.say(f"(row {persons} persons overlap={overlap} pinned={pinned} skipped: {ctx.left_s():.0f} s "
                        "left of this phase)")
                continue
            row = _pipeline_row(ctx, persons, overlap, pinned, yolo, pose, seg, FrameEngine, Runner, ZmqPublisher,
                                Source, SyntheticCamera, Stages, Subscriber, ReceiveTimeout)
            row["detector_deprecation_warnings"] = deprecations.count
            results.append(row)
            ctx.report.save()
            rows.append([persons, "yes" if overlap else "no (one stream, serialised)",
                         "yes" if pinned else "no (pageable: the host waits for each stage's copy)",
                         row["fps"], row["p50_ms"], row["p95_ms"], row["drops"], row["peak_gib"]])
    finally:
        logging.getLogger("ultralytics").removeHandler(deprecations)
    ctx.report.table(["persons", "stages overlapped", "pinned copies", "FPS", "capture->publish p50 ms", "p95 ms",
                      "camera frames dropped", "peak GPU GiB"], rows)
    ctx.report.results["pipeline_detector"] = dict(detector=detector, deprecation_warnings=deprecations.count,
                                                   first_warning=deprecations.first)
    ctx.say(f"\nUltralytics deprecation warnings during the rows: {deprecations.count}"
            + (f" (first: {deprecations.first})" if deprecations.count else ""))


def _pipeline_row(ctx, persons, overlap, pinned, yolo, pose, seg, FrameEngine, Runner, ZmqPublisher, Source,
                  SyntheticCamera, Stages, Subscriber, ReceiveTimeout) -> dict:
    h, w = ctx.frame
    ctx.reset_peak()
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

    def end_row() -> None:  # after the row's seconds, once a rate can be taken (a loaded machine is slow)
        until = time.monotonic() + ctx.seconds + MIN_RESULTS_WAIT_S
        if not stop.wait(ctx.seconds):
            while len(received) < MIN_RESULTS and time.monotonic() < until and not stop.wait(0.05):
                pass
            stop.set()

    listener = threading.Thread(target=listen, name="bench-subscriber", daemon=True)
    timer = threading.Thread(target=end_row, name="bench-row-timer", daemon=True)
    source.open()
    publisher.open(source.info)  # bind now so the subscriber can join before frames flow
    listener.start()
    publisher.wait_for_subscriber("keypoints.bench", 5)
    timer.start()
    t0 = time.perf_counter()
    stats = runner.run()
    elapsed = time.perf_counter() - t0
    stop.set()
    timer.join(1)
    listener.join(2)
    if stats.error is not None:
        raise stats.error
    skip = len(latencies) // 10  # warm-up
    lat, times = latencies[skip:], received[skip:]
    # The rate of published results over the kept window (start-up and shut-down excluded).
    fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    return dict(persons=persons, overlap=overlap, pinned=pinned, frames=stats.frames, fps=fps,
                fps_overall=stats.frames / elapsed,
                p50_ms=percentile(lat, 50) if lat else None, p95_ms=percentile(lat, 95) if lat else None,
                drops=source.frames_dropped,
                detector_calls=getattr(det, "calls", None), peak_gib=ctx.peak_gib())


def phase_syncs(ctx: Ctx) -> None:
    """Host synchronisations while the engine queues a frame (pose + seg): each one stalls the host
    until a stream drains, so the next frame cannot be queued and the stages stop overlapping."""
    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from stages.sapiens2.estimators import PoseEstimator, Segmenter
    from stages.types import Frame

    ctx.say("\n## Host synchronisations in FrameEngine.submit_batch (pose 2 persons + seg)\n")
    h, w = ctx.frame
    pose = PoseEstimator(ctx.ckpt("pose"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    seg = Segmenter(ctx.ckpt("seg"), device=ctx.device, dtype=ctx.dtype, input_size=ctx.size)
    engine = FrameEngine(Stages(ctx.device, FixedDetector(person_boxes(2, w, h)), {"pose": pose, "seg": seg}))
    image = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)

    def frame(i: int) -> Frame:
        return Frame(i, image, None, None, time.time_ns(), source_id="bench")

    # Warm as a run does (every shape of these steps run, their CUDA graphs captured: a capture checks its
    # replay against eager, which reads on the host), then one step: constants made, kernels chosen.
    engine.warm_up(max_persons=2, max_frames=1)
    engine.finish_batch(engine.submit_batch([frame(0)]), True)
    pendings: list = []

    def submit_three() -> None:
        if ctx.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            pendings.extend(engine.submit_batch([frame(i)]) for i in (1, 2, 3))
        finally:
            if ctx.cuda:
                torch.cuda.set_sync_debug_mode("default")

    sites = sync_sites(submit_three)
    finished = [r for pending in pendings for r in engine.finish_batch(pending, True)]
    if len(finished) != 3 or any(r.keypoints is None or len(r.keypoints.xy) != 2 or r.seg is None for r in finished):
        raise AssertionError("the engine did not return pose (2 persons) and seg for each of the 3 frames")
    if not ctx.cuda:
        ctx.say("3 frames submitted and finished through the engine (pose 2 persons + seg): the code path runs.")
        ctx.mark_cuda_only("host-device synchronisations exist only with CUDA (torch.cuda.set_sync_debug_mode); "
                           "on the CPU submit_batch computes the frame itself")
        return
    ctx.report.results["syncs"] = sites
    ctx.say(f"{sum(sites.values())} synchronising calls in 3 submits" + (":" if sites else " (none)"))
    for site, count in sorted(sites.items(), key=lambda kv: -kv[1]):
        ctx.say(f"- {site}: {count}")


def nvenc_status(width: int, height: int, cuda: bool) -> str | None:
    """None when h264_nvenc opens here at this size; otherwise why the NVENC row is n/a."""
    import av
    from sapiens2_client.video import probe_encoder

    if "h264_nvenc" not in av.codecs_available:
        return "n/a (this FFmpeg build has no h264_nvenc)"
    if probe_encoder("h264_nvenc", width + width % 2, height + height % 2, Fraction(30)):
        return None
    return "n/a (no NVENC on this GPU)" if cuda else "n/a (no NVENC: no GPU here)"


def phase_transfers(ctx: Ctx) -> None:
    """Pinned vs pageable copies, GPU vs CPU JPEG, hardware vs software video encoding."""
    import cv2

    from pipeline.sinks.publisher import JpegEncoder
    from pipeline.sinks.recorder import VideoRecorder
    from stages.sapiens2.preprocess import to_device_image
    from stages.types import Frame, FrameResult, StreamInfo

    h, w = ctx.frame
    image = camera_like_frame(h, w)
    ctx.say(f"\n## Transfers and encoders, one {h}x{w} frame (wall clock per call, host and device finished)\n")
    rows = []
    results = ctx.report.results.setdefault("transfers", [])

    def add(what: str, variant: str, stats: Stats | None, note: str = "") -> None:
        results.append(dict(what=what, variant=variant, ms=stats.samples_ms if stats else None, note=note))
        rows.append([what, variant, stats.p50 if stats else None, stats.p95 if stats else None, note])

    # The 3D keypoint step (stages.keypoints3d): 8 persons x 308 keypoints from a frame-size pointmap
    # with the seg map as the person mask; device time (CUDA events), target under 1 ms at window 1.
    from stages.keypoints3d import Lift, lift

    gen = torch.Generator().manual_seed(0)
    points = torch.randn(h, w, 3, generator=gen).to(ctx.device)
    person = (torch.rand(h, w, generator=gen) > 0.3).to(torch.uint8).to(ctx.device)
    xy = (torch.rand(8, 308, 2, generator=gen) * torch.tensor([w - 1.0, h - 1.0])).to(ctx.device)
    scores = torch.rand(8, 308, generator=gen).to(ctx.device)
    for window in (1, 5):
        rule = Lift(window=window)
        stats = ctx.measure(lambda: lift(points, xy, scores, rule, seg=person), warmup=5)
        note = "" if window != 1 else ("target < 1 ms: " + ("met" if stats.p50 < 1.0 else "MISSED")) if ctx.cuda \
            else "not the device: no target"
        add(f"3D keypoints, 8 persons, {h}x{w} map", f"window {window}", stats, note)
    # From here on measure() without a device: wall clock per call (host-side costs; a copy waits for the device).
    for pinned in (True, False):
        def upload() -> None:
            to_device_image(image, ctx.device, pinned)
            ctx.sync()

        add("frame upload (H2D)", "pinned staging" if pinned else "pageable", measure(upload, ctx.iters))
    seg_map = torch.randint(0, 29, (h, w), dtype=torch.uint8, device=ctx.device)
    host = torch.empty(seg_map.shape, dtype=torch.uint8, pin_memory=ctx.cuda)

    def download_pinned() -> None:
        host.copy_(seg_map, non_blocking=True)
        ctx.sync()

    add("seg map download (D2H)", "pinned buffer", measure(download_pinned, ctx.iters))
    add("seg map download (D2H)", "pageable", measure(lambda: seg_map.cpu(), ctx.iters))

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
        stats = measure(lambda: gpu_jpeg.encode(image), ctx.iters)
        add("JPEG q90 of the frame", "GPU (nvJPEG)", stats,
            fidelity(gpu_jpeg.encode(image)) if gpu_jpeg.active else "failed, fell back to the CPU (see the log)")
    else:
        add("JPEG q90 of the frame", "GPU (nvJPEG)", None, "n/a (no CUDA device)")
    add("JPEG q90 of the frame", "CPU (OpenCV)", measure(cpu_jpeg, ctx.iters), fidelity(cpu_jpeg()))
    # NVENC: probed first. H100/H200-class GPUs have no video encoder; timing the recorder there
    # would time its silent fall-back to libx264 under the NVENC label.
    nvenc = nvenc_status(w, h, ctx.cuda)
    ctx.report.results["nvenc"] = "available" if nvenc is None else nvenc
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("h264_nvenc", "libx264"):
            if codec == "h264_nvenc" and nvenc is not None:
                add("video encode per frame", "h264_nvenc (NVENC)", None, nvenc)
                continue
            rec = VideoRecorder(Path(tmp) / f"{codec}.mp4", fps=30.0, codec=codec)
            rec.open(StreamInfo("bench", w, h, 30.0, Fraction(1, 30), False))
            counter = iter(range(1 << 30))

            def write() -> None:
                i = next(counter)
                rec.write(FrameResult(Frame(i, image, i, Fraction(1, 30), time.time_ns())))

            frames = max(ctx.iters, 60)
            stats = measure(write, frames, warmup=5)
            t0 = time.perf_counter()
            rec.close()  # the encoder's buffered frames are flushed here: part of the per-frame cost
            per_frame = (sum(stats.samples_ms) + (time.perf_counter() - t0) * 1000.0) / frames
            used = rec.codec or "?"
            label = "h264_nvenc (NVENC)" if codec == "h264_nvenc" else "libx264 (CPU)"
            add("video encode per frame", label, stats,
                f"encoder used: {used}" + ("" if used == codec else " (NOT the one requested)")
                + f"; {per_frame:.1f} ms per frame with the final flush")
    ctx.report.table(["what", "variant", "ms p50", "p95", "note"], rows)
