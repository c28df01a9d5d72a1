"""Pipeline overhead per 1080p frame with the model work excluded, by part, against the 5 ms target.

Parts (each timed per frame, warm-up excluded, p50/p95):

* decode      PyAVReader.read of a generated 1080p H.264 file into RGB numpy (codec), next to a bare
              PyAV decode + to_ndarray of the same file; the difference is our reader's own cost
* upload      to_device_image (on the CPU a view, near zero; on CUDA a pinned non-blocking copy)
* plumbing    FullFrameDetector, FrameEngine.submit + finish with a constant-output pose stub, finish
              with prepared seg + matte outputs, and the whole Runner loop per frame (source read,
              engine, hand-off to the sink thread) with the stub stages; JSONL record building (info)
* annotation  compose_annotators(seg, boxes, pose, hud) on a copy of the frame, 2 persons x 308
              keypoints + a 1080p seg map, as the sink thread does; each annotator alone (info)
* device      steps that are GPU kernels on CUDA and host work here: the detector's letterbox and NMS
              (Ultralytics), the pose decode of one person (info)
* encoding    VideoRecorder.write (libx264, veryfast, crf 23) next to a bare PyAV libx264 encode, and
              what the sink thread pays with the encoder on its own thread
* publishing  ZmqPublisher.write on loopback with a keypoints-only subscriber, and with a frames
              subscriber (JPEG of the annotated frame); the JPEG encode alone (codec). On CUDA both JPEG
              paths: nvJPEG (the run's default there, ``--gpu-jpeg auto``) and OpenCV; on the CPU OpenCV
              only (said in the output)

The parts the host keeps per frame once the models' launches are gone (issue 34, item 6), each a row:
the detector's pre-processing (letterbox) and post-processing (Ultralytics' NMS + scale_boxes), the pose
decode, annotation, JPEG for publishing, recording (VideoRecorder.write, and what the sink thread pays
with the encoder on its own thread).

Our code is every part except the codecs (H.264 decode, H.264 encode, JPEG encode); its sum is
compared with the target of 5 ms per frame, and any part over budget is named.

    .venv/bin/python -m bench.bench_overhead [--iters 60] [--warmup 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import av
import cv2
import numpy as np
import torch
import zmq

from bench.harness import (
    Stats,
    add_common_args,
    dump_json,
    load_average,
    machine_info,
    measure,
    measure_interleaved,
    table,
    wait_quiet,
)
from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from pipeline.run.runner import Runner
from pipeline.run.step import Clock, FrameInFlight, Pending
from pipeline.sinks.jsonl import result_to_record
from pipeline.sinks.publisher import ZmqPublisher
from pipeline.sinks.recorder import VideoRecorder
from pipeline.sources import SourceEnded
from pipeline.sources.readers import open_file
from stages.annotate import compose_annotators
from stages.detect import FullFrameDetector
from stages.device import resolve_device
from stages.sapiens2.fastpath import FastPath
from stages.sapiens2.preprocess import to_device_image
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo

H, W = 1080, 1920
K = 308
TARGET_MS = 5.0
TIME_BASE = Fraction(1, 15360)


# -- inputs ------------------------------------------------------------------------------------
def synthetic_frame(i: int) -> np.ndarray:
    """A 1080p RGB frame with smooth gradients, moving shapes and mild noise (compresses like video)."""
    yy, xx = np.mgrid[0:H:4, 0:W:4]
    small = np.stack([(xx + 3 * i) % 256, (yy + 2 * i) % 256, ((xx + yy) // 2 + i) % 256], -1).astype(np.uint8)
    img = cv2.resize(small, (W, H), interpolation=cv2.INTER_LINEAR)
    for k in range(4):
        cx, cy = int((300 + 400 * k + 9 * i) % W), int((200 + 180 * k + 5 * i) % H)
        cv2.rectangle(img, (cx, cy), (cx + 260, cy + 420), (40 * k, 200 - 30 * k, 120), -1)
        cv2.circle(img, (cx + 130, cy - 60), 70, (220, 180, 150), -1)
    noise = np.random.default_rng(i).integers(0, 8, (H, W, 1), dtype=np.uint8)
    return cv2.add(img, np.broadcast_to(noise, img.shape).copy())


def write_h264(path: Path, frames: int, fps: int = 30) -> None:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps, options={"preset": "veryfast", "crf": "23"})
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        for i in range(frames):
            vf = av.VideoFrame.from_ndarray(synthetic_frame(i), format="rgb24")
            vf.pts = i
            for packet in stream.encode(vf):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def person_result(image: np.ndarray, index: int, rng: np.random.Generator) -> FrameResult:
    """2 persons x 308 keypoints inside their boxes, a blocky 1080p seg map, latencies for the HUD."""
    boxes = np.array([[300, 150, 760, 1050], [1100, 100, 1600, 1060]], np.float32)  # (2, 4)
    lo, hi = boxes[:, None, :2], boxes[:, None, 2:]
    xy = (lo + rng.random((2, K, 2), dtype=np.float32) * (hi - lo)).astype(np.float32)  # (2, K, 2)
    scores = rng.uniform(0.1, 1.0, (2, K)).astype(np.float32)  # (2, K)
    seg_small = rng.integers(0, 29, (H // 40, W // 40), dtype=np.uint8)
    seg = cv2.resize(seg_small, (W, H), interpolation=cv2.INTER_NEAREST)  # (H, W) uint8
    frame = Frame(index, image, index * 512, TIME_BASE, time.time_ns())
    det = Detections(boxes, np.array([0.9, 0.8], np.float32), np.array([1, 2], np.int64))
    latency = {"upload": 0.1, "seg": 20.0, "detect": 5.0, "pose": 30.0, "annotate": 8.0}
    return FrameResult(frame, det, Keypoints(xy, scores), seg=seg, latency_ms=latency, random_weights=True)


class PoseStub:
    """A pose stage whose preprocess/infer/postprocess return prepared constants (no model work)."""

    random_weights = True
    model = SimpleNamespace(cfg=SimpleNamespace(num_labels=K), dtype=torch.float32)  # what the engine reads

    def __init__(self, device: torch.device, n: int = 1) -> None:
        self.crops = torch.zeros(n, 3, 64, 48, device=device)
        self.heatmaps = torch.zeros(n, K, 16, 12, device=device)
        self.lowest = self.heatmaps.amin(dim=(2, 3))  # (n, K)
        self.xy = torch.rand(n, K, 2, device=device) * 500  # (N, K, 2)
        self.scores = torch.rand(n, K, device=device)  # (N, K)

    def preprocess(self, image: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        return self.crops

    def infer(self, crops: torch.Tensor, n: int) -> torch.Tensor:
        return self.heatmaps[:n]

    def postprocess(self, heatmaps: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(heatmaps)
        return self.xy[:n], self.scores[:n]

    def run_batch(self, images: list[torch.Tensor],
                  boxes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        n = sum(len(b) for b in boxes)
        xy, scores = self.postprocess(self.infer(self.crops, n), torch.cat(boxes))
        # What the engine checks for non-finite values, as the estimator's: the maps' minima are made
        # in decoding (model work, excluded here like the rest of it), so a constant of their shape.
        return xy, scores, [self.lowest[:n], xy, scores]

    fastpath = FastPath(cuda_graphs="off")  # what the engine reads of an estimator's fast path


class ListSource:
    """The Source interface over prepared frames (no decode thread): isolates the runner's own cost."""

    frames_dropped = 0
    reopens = 0

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self.pos = 0
        self.info = StreamInfo("bench", W, H, 30.0, TIME_BASE, live=False)

    def read(self, timeout: float) -> Frame | None:
        if self.pos >= len(self.frames):
            raise SourceEnded()
        self.pos += 1
        return self.frames[self.pos - 1]

    def stop(self) -> None:
        """Nothing to stop."""


class Drain(threading.Thread):
    """A SUB socket on loopback that reads everything for its topic prefix until stopped."""

    def __init__(self, ctx: zmq.Context, endpoint: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.sock = ctx.socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, prefix)
        self.stop = threading.Event()
        self.received = 0

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stop.is_set():
            if poller.poll(50):
                while True:
                    try:
                        self.sock.recv_multipart(zmq.NOBLOCK)
                        self.received += 1
                    except zmq.Again:
                        break
        self.sock.close(linger=0)


# -- the parts ---------------------------------------------------------------------------------
class Report:
    def __init__(self, iters: int, warmup: int) -> None:
        self.iters, self.warmup = iters, warmup
        self.rows: list[dict[str, Any]] = []
        self.stats: dict[str, Stats] = {}

    def add(self, part: str, what: str, kind: str, s: Stats | None, summed: bool, p50: float | None = None,
            note: str = "") -> None:
        """kind: ours | codec | derived (a p50 difference of two measured rows) | info (inside another row)."""
        if s is not None:
            self.stats[f"{part}: {what}"] = s
        self.rows.append({"part": part, "measured": what, "kind": kind, "p50 ms": s.p50 if s else p50,
                          "p95 ms": s.p95 if s else None, "in sum": "yes" if summed else "", "note": note})
        print(f"  {part:<11} {what:<52} {kind:<7} p50 {self.rows[-1]['p50 ms']:8.3f} ms", flush=True)

    def time(self, fn: Callable[[], object], device: str | torch.device = "cpu") -> Stats:
        return measure(fn, self.iters, self.warmup, device)

    def pair(self, fns: dict[str, Callable[[], object]]) -> dict[str, Stats]:
        return measure_interleaved(fns, self.iters, self.warmup, "cpu")


def bench_decode(r: Report, video: Path) -> None:
    reader = open_file(str(video))
    container = av.open(str(video))
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"  # as PyAVReader sets it
    frames = container.decode(stream)
    s = r.pair({"reader": reader.read, "bare": lambda: next(frames).to_ndarray(format="rgb24")})
    reader.close()
    container.close()
    r.add("decode", "PyAVReader.read: H.264 1080p -> RGB numpy", "codec", s["reader"], False)
    r.add("decode", "bare PyAV decode + to_ndarray(rgb24)", "codec", s["bare"], False)
    r.add("decode", "reader's own cost (read - bare)", "derived", None, True, s["reader"].p50 - s["bare"].p50)


def bench_upload(r: Report, image: np.ndarray, device: torch.device) -> None:
    s = r.time(lambda: to_device_image(image, device), device)
    note = "CPU: a zero-copy view, near zero" if device.type == "cpu" else "pinned non-blocking H2D copy"
    r.add("upload", f"to_device_image ({device.type})", "ours", s, False, note=note + "; inside plumbing")


def bench_plumbing(r: Report, images: list[np.ndarray], device: torch.device, rng: np.random.Generator) -> None:
    det = FullFrameDetector()
    r.add("plumbing", "FullFrameDetector.detect (Detections)", "ours", r.time(lambda: det.detect(images[0])), False,
          note="inside engine")
    stages = Stages(device, det, {"pose": PoseStub(device)}, True)
    engine = FrameEngine(stages, overlap=True)
    counter = iter(range(1 << 30))

    def frame() -> Frame:
        i = next(counter)
        return Frame(i, images[i % len(images)], i * 512, TIME_BASE, time.time_ns())

    r.add("plumbing", "engine submit+finish, pose stub, 1 person", "ours",
          r.time(lambda: engine.finish(engine.submit(frame()), True)), False, note="inside runner")

    # finish() with prepared full-frame outputs: collect, Matte/FrameResult validation.
    seg = torch.from_numpy(person_result(images[0], 0, rng).seg)
    alpha = torch.rand(H, W)
    fg = torch.rand(H, W, 3)
    seg_engine = FrameEngine(Stages(device, det, {}, True), overlap=True)

    def finish_dense() -> None:
        f = frame()
        work = FrameInFlight(f, to_device_image(f.image, device), det.detect(f.image),
                         outputs={"seg": seg, "matting": alpha, "matting.fg": fg})
        seg_engine.finish(Pending([work], Clock(device)), True)

    r.add("plumbing", "engine finish, prepared seg + matte outputs", "ours", r.time(finish_dense), True,
          note="only when seg/matting run")

    # Whole runner loop per frame, stub stages, no sinks: intervals between finished frames.
    n = r.iters + r.warmup + 1
    frames = [Frame(i, images[i % len(images)], i * 512, TIME_BASE, time.time_ns()) for i in range(n)]
    stamps: list[float] = []
    runner = Runner(ListSource(frames), FrameEngine(stages, overlap=True), [], None, True,
                    on_result=lambda res: stamps.append(time.perf_counter()))
    stats = runner.run()
    if stats.error is not None:
        raise stats.error
    gaps = np.diff(stamps)[r.warmup:] * 1000.0
    r.add("plumbing", "Runner loop per frame (source read, engine, sink hand-off)", "ours",
          Stats.from_samples(gaps.tolist()), True, note="includes upload, detector and engine rows")

    res = person_result(images[0], 0, rng)
    r.add("plumbing", "JSONL record + json.dumps, 2 persons (optional sink)", "info",
          r.time(lambda: json.dumps(result_to_record(res), separators=(",", ":"))), False,
          note="only with --save-keypoints")


def bench_device_steps(r: Report, images: list[np.ndarray], device: torch.device) -> None:
    """Steps that run on the device on CUDA (kernels the host only queues) and on the host here: the
    detector's letterbox and NMS, the pose decode of one person at the real heatmap size."""
    from ultralytics.utils import nms, ops

    from stages.detect.letterbox import letterbox_batch
    from stages.sapiens2.postprocess import decode_pose

    frame = to_device_image(images[0], device)
    r.add("device", "detector letterbox 1080p -> 384x640 (stages.detect.letterbox)", "info",
          r.time(lambda: letterbox_batch([frame], 640, auto=True), device), False, note="GPU kernels on CUDA")
    gen = torch.Generator().manual_seed(0)
    preds = torch.rand(1, 84, 5040, generator=gen).to(device) * 0.1  # YOLO11n at 384x640: 5040 anchors
    preds[:, 4, :20] = 0.9  # twenty confident persons

    def post() -> None:
        (det,) = nms.non_max_suppression(preds, 0.25, 0.7, [0], False, max_det=16, nc=0)
        ops.scale_boxes((384, 640), det[:, :4], (H, W))

    r.add("device", "detector NMS + scale_boxes (Ultralytics)", "info", r.time(post, device), False,
          note="reads the kept count on the host")
    heatmaps = torch.rand(1, 308, 256, 192, generator=gen).to(device)  # (N, K, h, w) of a 1024x768 crop
    boxes = torch.tensor([[100.0, 50.0, 700.0, 1000.0]], device=device)
    r.add("device", "pose decode, 1 person, 308 x 256x192 heatmaps (DARK-UDP)", "info",
          r.time(lambda: decode_pose(heatmaps, boxes, (1024, 768)), device), False, note="GPU kernels on CUDA")


def bench_annotation(r: Report, images: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    results = [person_result(img, i, rng) for i, img in enumerate(images)]
    chain = compose_annotators(["seg", "boxes", "pose", "hud"])
    it = iter(range(1 << 30))

    def annotate() -> np.ndarray:
        res = results[next(it) % len(results)]
        return chain.annotate(res.frame.image.copy(), res)

    r.add("annotation", "compose_annotators(seg, boxes, pose, hud) + frame copy", "ours", r.time(annotate), True,
          note="2 persons x 308 kps + seg map")
    base = results[0].frame.image
    canvas = base.copy()
    r.add("annotation", "  frame copy", "info", r.time(lambda: np.copyto(canvas, base)), False)
    for a in chain.annotators:
        r.add("annotation", f"  {type(a).__name__}", "info", r.time(lambda a=a: a.annotate(canvas, results[0])), False)
    return [chain.annotate(res.frame.image.copy(), res) for res in results]


def bench_encoding(r: Report, annotated: list[np.ndarray], rng: np.random.Generator, tmp: Path) -> None:
    results = [person_result(img, i, rng) for i, img in enumerate(annotated)]
    for res, img in zip(results, annotated):
        res.annotated = img
    rec = VideoRecorder(tmp / "rec.mp4", codec="libx264", crf=23, threaded=False)  # the encode itself, timed
    rec.open(StreamInfo("bench", W, H, 30.0, TIME_BASE, live=False))
    out = av.open(str(tmp / "bare.mp4"), "w")
    stream = out.add_stream("libx264", rate=30, options={"preset": "veryfast", "crf": "23"})
    stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
    i_rec, i_bare = iter(range(1 << 30)), iter(range(1 << 30))

    def record() -> None:
        i = next(i_rec)
        res = results[i % len(results)]
        res.frame = Frame(i, res.frame.image, i * 512, TIME_BASE, res.frame.capture_ns)  # increasing pts
        rec.write(res)

    def bare() -> None:
        i = next(i_bare)
        vf = av.VideoFrame.from_ndarray(annotated[i % len(annotated)], format="rgb24")
        vf.pts = i
        for packet in stream.encode(vf):
            out.mux(packet)

    cpu0 = time.process_time()
    s = r.pair({"recorder": record, "bare": bare})
    cpu_ms = (time.process_time() - cpu0) * 1000.0 / (r.iters + r.warmup) / 2
    rec.close()
    for packet in stream.encode(None):
        out.mux(packet)
    out.close()
    r.add("encoding", "VideoRecorder.write, libx264 veryfast crf 23", "codec", s["recorder"], False,
          note=f"process CPU incl. x264 threads ~{cpu_ms:.0f} ms/frame per encoder")
    r.add("encoding", "bare PyAV from_ndarray + libx264 encode + mux", "codec", s["bare"], False)
    r.add("encoding", "recorder's own cost (write - bare)", "derived", None, True, s["recorder"].p50 - s["bare"].p50)
    # What the sink thread pays now: the hand-over to the encoder thread, frames coming at the pace the
    # encoder keeps up with (a faster stream waits at the two-frame queue: the encoder is then the limit).
    threaded = VideoRecorder(tmp / "threaded.mp4", codec="libx264", crf=23)
    threaded.open(StreamInfo("bench", W, H, 30.0, TIME_BASE, live=False))
    pause, samples = s["recorder"].p50 * 1.5 / 1000.0, []
    for i in range(r.iters + r.warmup):
        res = results[i % len(results)]
        res.frame = Frame(i, res.frame.image, i * 512, TIME_BASE, res.frame.capture_ns)
        time.sleep(pause)
        t0 = time.perf_counter()
        threaded.write(res)
        samples.append((time.perf_counter() - t0) * 1000.0)
    threaded.close()
    r.add("encoding", "VideoRecorder.write on the sink thread (libx264 on its own thread)", "ours",
          Stats.from_samples(samples[r.warmup:]), False, note="the encode rows above run on the encoder thread")


def jpeg_paths(device: torch.device) -> tuple[list[str], str]:
    """The JPEG encoders of published frames timed here, and the one a run uses by default: nvJPEG on CUDA
    (``--gpu-jpeg auto``), OpenCV on the CPU."""
    return (["nvJPEG", "OpenCV"], "nvJPEG") if device.type == "cuda" else (["OpenCV"], "OpenCV")


def bench_publishing(r: Report, annotated: list[np.ndarray], rng: np.random.Generator,
                     device: torch.device) -> dict[str, Any]:
    """The publisher's write per frame with a keypoints-only and a frames subscriber (each JPEG path), the
    JPEG encode alone, and the frames path's own cost (write - JPEG) of the default path. What was timed."""
    from pipeline.sinks.jpeg import JpegEncoder

    res = person_result(annotated[0], 0, rng)
    res.annotated = annotated[0]
    info = StreamInfo("bench", W, H, 30.0, TIME_BASE, live=False, random_weights=True)
    ctx = zmq.Context()
    paths, default = jpeg_paths(device)
    cases = [("keypoints.", "keypoints-only subscriber", "ours", default == "nvJPEG")]
    cases += [("frame.", "frames subscriber (JPEG q90 of annotated frame)" + (", nvJPEG" if path == "nvJPEG" else ""),
               "codec", path == "nvJPEG") for path in paths]
    frames_stats: dict[bool, Stats] = {}
    notes: list[str] = []
    for prefix, what, part_kind, gpu in cases:
        pub = ZmqPublisher("tcp://127.0.0.1:*", status_interval_s=3600.0, gpu_jpeg=gpu)
        pub.open(info)
        drain = Drain(ctx, pub.endpoint, prefix)
        drain.start()
        if not pub.wait_for_subscriber(prefix + "bench", 5.0):
            raise RuntimeError(f"no {prefix} subscriber reached the publisher on loopback")
        counter = iter(range(1 << 30))

        def write() -> None:
            res.frame = Frame(next(counter), res.frame.image, 0, TIME_BASE, res.frame.capture_ns)
            pub.write(res)

        s = r.time(write)
        time.sleep(0.2)
        dropped = sum(pub.stats.dropped.values())
        pub.close()
        drain.stop.set()
        drain.join(2.0)
        used = "" if not gpu or prefix != "frame." else \
            ("; nvJPEG in use" if pub.jpeg.active else "; nvJPEG FAILED, fell back to OpenCV (see the log)")
        r.add("publishing", f"ZmqPublisher.write, {what}", part_kind, s, prefix == "keypoints.",
              note=f"{drain.received} received, {dropped} dropped{used}")
        if prefix == "frame.":
            frames_stats[gpu] = s
    ctx.term()
    img = annotated[0]
    alone: dict[bool, Stats] = {}
    alone[False] = r.time(lambda: cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                                               [cv2.IMWRITE_JPEG_QUALITY, 90]))
    r.add("publishing", "JPEG encode q90 alone (cv2 RGB->BGR + imencode)", "codec", alone[False], False)
    if "nvJPEG" in paths:
        encoder = JpegEncoder(90, "auto")
        alone[True] = r.time(lambda: encoder.encode(img))
        r.add("publishing", "JPEG encode q90 alone (nvJPEG: JpegEncoder, host copy + upload + encode + download)",
              "codec", alone[True], False, note="nvJPEG in use" if encoder.active else "nvJPEG FAILED: timed nothing")
    else:
        notes.append("JPEG of published frames: OpenCV only here (no CUDA device); on CUDA nvJPEG, the run's "
                     "default there (--gpu-jpeg auto), is timed beside it")
        print(f"  {notes[-1]}", flush=True)
    gpu = default == "nvJPEG"
    r.add("publishing", "frames path's own cost (write - JPEG)", "derived", None, True,
          frames_stats[gpu].p50 - alone[gpu].p50, note=f"{default}, the default here")
    return {"paths": paths, "default": default, "notes": notes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, iters=60, warmup=5)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rng = np.random.default_rng(0)
    r = Report(args.iters, args.warmup)
    if args.wait_quiet > 0:
        busy = wait_quiet(args.wait_quiet)
        print(f"CPU busy with other work before starting: {busy if busy is None else f'{busy:.0%}'}", flush=True)
    load0 = load_average()
    head = (f"pipeline overhead per {W}x{H} frame, model work excluded; device {device.type}, "
            f"{torch.get_num_threads()} torch threads, {cv2.getNumThreads()} cv2 threads, torch {torch.__version__}, "
            f"PyAV {av.__version__} (FFmpeg {'.'.join(map(str, av.library_versions['libavcodec']))} libavcodec), "
            f"iters {args.iters} (+{args.warmup} warm-up)")
    print(head, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tmp) / "yolo"))  # Ultralytics' settings, never in ~
        video = Path(tmp) / "clip_1080p.mp4"
        write_h264(video, args.iters + args.warmup + 2)
        images = [synthetic_frame(i) for i in range(8)]
        bench_decode(r, video)
        bench_upload(r, images[0], device)
        bench_plumbing(r, images, device, rng)
        bench_device_steps(r, images, device)
        annotated = bench_annotation(r, images, rng)
        bench_encoding(r, annotated, rng, Path(tmp))
        jpeg = bench_publishing(r, annotated, rng, device)
    ours = [row for row in r.rows if row["in sum"]]
    # A negative difference is measurement noise (the two paths cost the same): it counts as zero.
    total = sum(max(0.0, row["p50 ms"]) for row in ours)
    codec = {row["measured"]: row["p50 ms"] for row in r.rows if row["kind"] == "codec"}
    print()
    print(head)
    print(f"1-min load average at start / end: {load0} / {load_average()} (2 cores)")
    print(table(r.rows, ["part", "measured", "kind", "p50 ms", "p95 ms", "in sum", "note"], floatfmt=".3f"))
    print("kind: ours = our code; codec = FFmpeg/x264/libjpeg work; derived = difference of two p50s above "
          "(negative = noise, summed as 0); info = already inside another row")
    verdict = "MET" if total <= TARGET_MS else "MISSED"
    print(f"\nour code per frame (sum of 'in sum' p50s): {total:.2f} ms vs target {TARGET_MS:.1f} ms -> {verdict}")
    for row in sorted(ours, key=lambda x: -x["p50 ms"]):
        share = row["p50 ms"]
        flag = f"  <- alone over the budget by {share - TARGET_MS:.2f} ms" if share > TARGET_MS else ""
        print(f"  {row['part']:<11} {row['measured']:<60} {share:7.3f} ms{flag}")
    if total > TARGET_MS:
        print(f"  over budget by {total - TARGET_MS:.2f} ms")
    nvjpeg = next((v for k, v in codec.items() if k.startswith("JPEG encode q90 alone (nvJPEG")), None)
    print(f"codecs per frame (p50): decode {codec.get('PyAVReader.read: H.264 1080p -> RGB numpy', 0):.2f} ms, "
          f"H.264 encode {codec.get('VideoRecorder.write, libx264 veryfast crf 23', 0):.2f} ms, JPEG "
          f"{codec.get('JPEG encode q90 alone (cv2 RGB->BGR + imencode)', 0):.2f} ms (OpenCV)"
          + (f", {nvjpeg:.2f} ms (nvJPEG)" if nvjpeg is not None else ""))
    for note in jpeg["notes"]:
        print(note)
    if args.json:
        dump_json(args.json, {"header": head, "target_ms": TARGET_MS, "our_code_ms": total, "verdict": verdict,
                              "machine": machine_info(device), "load_average_1m": [load0, load_average()],
                              "jpeg": jpeg, "rows": r.rows, "stats": r.stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
