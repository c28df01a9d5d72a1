"""The branches that only run on CUDA, run on the CPU in the situation a GPU creates (tests/fakecuda.py:
streams, events and page-locked memory stood in for; a copy to page-locked memory lands only when
the host has waited for it; "device" tensors are CPU tensors, so every result can be compared with
the CPU engine's).

What a GPU run relies on: every lane that reads an uploaded frame waits for the upload's event and
keeps the frame's memory in use; results come back through page-locked buffers whose events the
host waits for, this step's only (never a device-wide synchronize); stage timing reads completed
events; the staging ring never rewrites a buffer a copy has not read; pageable and one-stream modes
give the same results; the run pipelines and warms up on CUDA; a float16 dense stage falls back with
the 3D step redone. Beside the engine: a stage's warm-up, GPU JPEG, GPU memory metrics, the
background compile's stream, and a detector on another device than the frames.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline.run.streams
from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from pipeline.run.step import Clock
from pipeline.run.streams import Streams
from stages.keypoints3d import Lift
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import estimator_for
from stages.sapiens2.preprocess import upload
from stages.sapiens2.tiny import make_tiny
from stages.types import Detections, Frame, FrameResult
from tests.fakecuda import FakeGpu, FakeStream
from tests.pipeline.run.test_gpu_path import Collect, Frames

CUDA = torch.device("cuda", 0)
pytestmark = pytest.mark.timeout(300)


class TwoPeople:
    random_weights = False

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        boxes = np.array([[10, 10, 60, 90], [50, 20, 110, 95]], np.float32)
        return [Detections(boxes, np.array([0.9, 0.8], np.float32), np.arange(2)) for _ in images]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # the pointmap's scale branch fixes its own input size
    return {task: make_tiny(tmp_path_factory.mktemp(task), task, **({} if task == "pointmap" else
                                                                     {"image_size": (64, 48)}))
            for task in ("pose", "seg", "pointmap")}


def _estimator(task: str, folder: Path, dtype: str = "float32"):
    model = load_model(folder, device="cpu", dtype=dtype)
    return estimator_for(task)(model, **({"input_size": tuple(model.cfg.image_size)} if task == "pointmap" else {}))


@pytest.fixture(scope="module")
def estimators(checkpoints: dict[str, Path]) -> dict:
    return {task: _estimator(task, folder) for task, folder in checkpoints.items()}


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    fake = FakeGpu(monkeypatch)
    monkeypatch.setattr(pipeline.run.streams, "_STREAMS", {})  # lanes made of these stand-ins, for this test only
    yield fake


def _engine(estimators: dict, device: torch.device, **kwargs) -> FrameEngine:
    return FrameEngine(Stages(device, TwoPeople(), dict(estimators)), keypoints3d=Lift(threshold=0.0), **kwargs)


def _step(i: int) -> list[Frame]:
    """One frame of each of two sources (two sizes)."""
    rng = np.random.default_rng(i)
    return [Frame(i, rng.integers(0, 256, hw + (3,), dtype=np.uint8), i, Fraction(1, 30), time.time_ns(), sid)
            for sid, hw in (("a", (100, 120)), ("b", (96, 128)))]


def _same(got: list[FrameResult], want: list[FrameResult]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.keypoints.xy, w.keypoints.xy)
        np.testing.assert_array_equal(g.keypoints.scores, w.keypoints.scores)
        np.testing.assert_array_equal(g.detections.boxes, w.detections.boxes)
        np.testing.assert_array_equal(g.seg, w.seg)
        np.testing.assert_array_equal(g.pointmap, w.pointmap)
        np.testing.assert_array_equal(g.keypoints3d.xyz, w.keypoints3d.xyz)
        np.testing.assert_array_equal(g.keypoints3d.valid, w.keypoints3d.valid)


def _cpu_results(estimators: dict, steps: int) -> list[list[FrameResult]]:
    cpu = _engine(estimators, torch.device("cpu"))
    return [cpu.finish_batch(cpu.submit_batch(_step(i)), False) for i in range(steps)]


# -- the engine's step -------------------------------------------------------------------------
def test_a_pipelined_cuda_run_gives_the_cpu_results_without_a_device_wide_sync(estimators: dict,
                                                                               gpu: FakeGpu) -> None:
    """As the runner drives it on CUDA: step t+1 is queued before step t is finished. Each result is
    read after its own events only; a result read before its copy landed would be NaN or 90."""
    want = _cpu_results(estimators, 3)
    engine = _engine(estimators, CUDA)
    pending = engine.submit_batch(_step(0))
    got = []
    for i in (1, 2):
        queued = engine.submit_batch(_step(i))
        got.append(engine.finish_batch(pending, False))
        pending = queued
    got.append(engine.finish_batch(pending, False))
    for g, w in zip(got, want):
        _same(g, w)
    assert gpu.calls("device.synchronize") == []
    latency = got[0][0].latency_ms  # read from the stage's own CUDA events, completed
    assert {"upload", "seg", "pointmap", "pose", "keypoints3d"} <= set(latency)
    assert all(latency[k] > 0 for k in ("upload", "seg", "pointmap", "pose", "keypoints3d"))


def test_every_lane_that_reads_the_frame_waits_for_its_upload(estimators: dict, gpu: FakeGpu) -> None:
    engine = _engine(estimators, CUDA)
    streams = engine.streams.cuda_streams
    pending = engine.submit_batch(_step(0))
    uploaded = next(e for kind, s, e in reversed(gpu.calls("record")) if s is streams["upload"])
    frames = {w.image.untyped_storage().data_ptr() for w in pending.frames}
    for lane in ("seg", "dense", "pose"):  # segmentation, the pointmap, pose: each reads the uploaded frames
        queued = streams[lane].items
        assert queued[0] == ("wait", uploaded), f"{lane} queued work before waiting for the upload"
        kept = {ptr for kind, stream, ptr in gpu.calls("record_stream") if stream is streams[lane]}
        assert frames <= kept, f"{lane} reads frames the allocator could hand out again under it"
    for event in pending.dense_done:  # the 3D step on the pose lane reads the dense maps: after them
        assert ("wait", streams["pose"], event) in gpu.log
        assert event.stream in (streams["seg"], streams["dense"])
    engine.finish_batch(pending, False)


def test_finishing_a_step_waits_for_that_steps_events_only(estimators: dict, gpu: FakeGpu) -> None:
    engine = _engine(estimators, CUDA)
    first = engine.submit_batch(_step(0))
    start = gpu.ticks
    second = engine.submit_batch(_step(1))
    assert second.done and all(e.stream is not None and e.tick > start for e in second.done)
    for host in [*second.outputs.values(), *(t for w in second.frames for t in w.outputs.values())]:
        assert host.is_pinned(), "a result copied to pageable memory (the host waits for it)"
    before = len(gpu.log)
    engine.finish_batch(second, False)
    waited = [entry[1] for entry in gpu.log[before:] if entry[0] == "event.synchronize"]
    assert waited and all(e.tick > start for e in waited)  # the step before is none of its business
    assert not any(entry[0] in ("device.synchronize", "stream.synchronize") for entry in gpu.log[before:])
    engine.finish_batch(first, False)  # (done already: its streams ran on to the later step's events)


@pytest.mark.parametrize("pinned, overlap", [(False, True), (True, False)])
def test_pageable_memory_and_one_stream_give_the_same_results(estimators: dict, gpu: FakeGpu, pinned: bool,
                                                              overlap: bool) -> None:
    """--no-pinned-memory: plain copies the host waits for, no events to wait on; overlap off (a
    benchmark's baseline): every lane is one stream, in order."""
    want = _cpu_results(estimators, 2)
    engine = _engine(estimators, CUDA, pinned=pinned, overlap=overlap)
    assert len({id(s) for s in engine.streams.cuda_streams.values()}) == (6 if overlap else 1)
    got = []
    for i in range(2):
        pending = engine.submit_batch(_step(i))
        assert bool(pending.done) is pinned
        got.append(engine.finish_batch(pending, False))
    for g, w in zip(got, want):
        _same(g, w)
    copies = {c[2:] for c in gpu.calls("h2d")}
    assert copies == ({("pinned", True)} if pinned else {("pageable", False)})
    if not pinned:
        assert gpu.calls("d2h") == [] and gpu.calls("d2h.blocking")


# -- the pieces ------------------------------------------------------------------------------
def test_the_staging_ring_reuses_a_buffer_only_after_the_device_read_it(gpu: FakeGpu) -> None:
    streams = Streams(CUDA, overlap=True, pinned=True)
    ring, stream = streams.staging, streams.cuda_streams["upload"]
    frames = [np.full((4, 6, 3), i, np.uint8) for i in range(6)]
    with streams.use("upload"):
        outs = [ring.upload(f) for f in frames[:4]]  # no copy read yet: four buffers
        assert ring.buffers() == 4
        gpu.complete(stream, stream.items.index(next(i for i in stream.items if i[0] == "record")) + 1)
        outs.append(ring.upload(frames[4]))  # the device read the first one: it is used again
        assert ring.buffers() == 4
        gpu.idle()
        outs.append(ring.upload(frames[5]))
    for frame, out in zip(frames, outs):
        np.testing.assert_array_equal(out.numpy(), frame)
    copies = gpu.calls("h2d")
    assert len(copies) == 6 and all(c[1] is stream and c[2:] == ("pinned", True) for c in copies)
    # each copy's event is recorded right after it, on its stream: its completion says the buffer was read
    kinds = [item[0] for item in stream.items]
    assert kinds == ["read", "record"] * 6


def test_clock_reads_timing_events_of_the_stages_streams(gpu: FakeGpu) -> None:
    clock = Clock(CUDA)
    a, b = FakeStream(gpu, 7), FakeStream(gpu, 8)
    clock.start("seg", a)
    clock.start("pose", b)
    clock.stop("seg", a)  # pose is never stopped: it did not run to the end of this step
    assert [s for kind, s, _ in gpu.calls("record")] == [a, b, a]
    assert clock.millis() == {"seg": 2.0}  # (the stand-in's time: events apart)


def test_an_upload_of_its_own_is_pinned_and_does_not_block(gpu: FakeGpu) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = upload(data, CUDA)
    np.testing.assert_array_equal(out.numpy(), data)
    assert gpu.calls("h2d") == [("h2d", gpu.default, "pinned", True)]
    out = upload(data, CUDA, pinned=False)  # pageable: a plain copy, the host waits
    assert gpu.calls("h2d")[-1] == ("h2d", gpu.default, "pageable", False)
    np.testing.assert_array_equal(out.numpy(), data)


def test_a_stage_warm_up_on_cuda_waits_for_its_own_lane_only(estimators: dict, gpu: FakeGpu,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """stages/sapiens2/estimators.py: the warm-up ends when its stream is done (its shapes run, its
    graphs captured), not when the whole device is (another stage warms up on another lane)."""
    seg = estimators["seg"]
    monkeypatch.setattr(type(seg), "device", property(lambda self: CUDA))
    lane = torch.cuda.Stream(CUDA)
    with torch.cuda.stream(lane):
        seg.warmup(2)
    assert gpu.calls("stream.synchronize") == [("stream.synchronize", lane)] and not gpu.calls("device.synchronize")
    copies = gpu.calls("h2d")  # its pictures, uploaded as frames are: page-locked, on its lane, not waited for
    assert copies and set(copies) == {("h2d", lane, "pinned", True)}


# -- sinks, metrics, the run ------------------------------------------------------------------
def _picture(h: int, w: int, seed: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 255 // w + 40 * seed) % 256, y * 255 // h, np.full((h, w), 60 * seed % 256)],
                    axis=-1).astype(np.uint8)


def test_gpu_jpeg_stages_each_size_once_and_copies_on_its_own_stream(gpu: FakeGpu,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """pipeline/sinks/jpeg.py on CUDA: the frame goes through one page-locked buffer per size (not
    rewritten before its copy was read: the fake refuses that), copied on the encoder's own stream
    (never a model's), which is done before nvJPEG reads it; the JPEG holds the frame."""
    import cv2

    from pipeline.sinks.jpeg import JpegEncoder

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    encoder = JpegEncoder(90, "auto")
    own = encoder._stream
    assert encoder.active and encoder.device.type == "cuda" and own is not gpu.default
    pictures = [_picture(48, 64, 0), _picture(48, 64, 1), _picture(32, 40, 2)]
    for picture in pictures:
        data = encoder.encode(picture)
        decoded = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        assert decoded.shape == picture.shape and np.abs(decoded.astype(int) - picture).mean() < 3.0
    assert encoder.active and len(gpu.pinned) == 2  # one buffer per frame size
    assert gpu.calls("h2d") == [("h2d", own, "pinned", True)] * 3
    assert gpu.calls("stream.synchronize") == [("stream.synchronize", own)] * 3


def test_gpu_jpeg_encodes_on_the_runs_device_from_the_sink_thread(gpu: FakeGpu) -> None:
    """pipeline/sinks/jpeg.py for a run on cuda:1: the sink thread's current device is 0 (CUDA's is per
    thread), so the encoder holds the run's indexed device and makes it current around each encode."""
    import threading

    from pipeline.sinks.jpeg import JpegEncoder

    encoder = JpegEncoder(90, "cuda:1")
    assert encoder.device == torch.device("cuda", 1)
    seen: list = []

    def sink_thread() -> None:
        seen.append(torch.cuda.current_device())
        seen.append(encoder.encode(_picture(48, 64, 0)))
        seen.append(torch.cuda.current_device())

    thread = threading.Thread(target=sink_thread)
    thread.start()
    thread.join(60)
    before, data, after = seen
    assert before == after == 0 and data is not None and encoder.active
    assert gpu.calls("set_device") == [("set_device", 1)]  # made current for the encode, then given back
    assert JpegEncoder(90, "cuda").device == torch.device("cuda", 0)  # "cuda": the current device, indexed


def test_gpu_memory_is_read_for_the_runs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.metrics import PipelineMetrics, _gauge_values

    asked: list = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: asked.append(device) or 1234)
    metrics = PipelineMetrics()
    metrics.describe_run(["pose"], "0.4b", "bfloat16", CUDA, False)
    metrics.collect_now()
    assert asked == [CUDA] and _gauge_values(metrics.gpu_memory) == [({"device": "cuda:0"}, 1234.0)]
    on_cpu = PipelineMetrics()
    on_cpu.describe_run(["pose"], "0.4b", "float32", torch.device("cpu"), False)
    on_cpu.collect_now()
    assert asked == [CUDA] and _gauge_values(on_cpu.gpu_memory) == []


def test_a_cuda_run_warms_up_before_its_first_frame_and_pipelines(estimators: dict, gpu: FakeGpu,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """pipeline/run/app.py: on CUDA the stages warm up on their lanes (and the detector per frame size)
    even with nothing else to check; pipeline/run/runner.py: a CUDA engine queues step t+1 before it
    finishes step t. Every frame comes out, in order, as the CPU computes it."""
    import threading

    from pipeline.cli.config import RunConfig
    from pipeline.run.app import assemble

    warmed: list[tuple] = []
    real_warm_up = FrameEngine.warm_up
    monkeypatch.setattr(FrameEngine, "warm_up", lambda self, *a: (warmed.append(a), real_warm_up(self, *a))[1])
    chosen = {task: estimators[task] for task in ("pose", "seg")}
    assert not any(est.needs_warm_up for est in chosen.values())  # on the CPU nothing would warm up
    sink = Collect()
    cfg = RunConfig(source=["cam"], progress=False)
    runner, _ = assemble(cfg, [Frames(4)], Stages(CUDA, TwoPeople(), chosen), [sink], threading.Event())
    assert warmed == [(cfg.max_persons, 1, ((100, 120),))] and runner.pipelined
    stats = runner.run()
    assert stats.error is None and [r.frame.index for r in sink.results] == [0, 1, 2, 3]
    cpu = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), chosen))
    for result in sink.results:
        want = cpu.finish(cpu.submit(result.frame), False)
        np.testing.assert_array_equal(result.keypoints.xy, want.keypoints.xy)
        np.testing.assert_array_equal(result.seg, want.seg)
    assert gpu.calls("device.synchronize") == []


def test_with_the_full_frame_as_the_person_pose_warms_up_one_person_per_frame(estimators: dict, gpu: FakeGpu,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole frame is one box: a CUDA run captures (and with --compile compiles) pose for the batches
    it will see, one person per frame of a step, not for --max-persons of them."""
    import threading

    from pipeline.cli.config import RunConfig
    from pipeline.run.app import assemble
    from stages.detect import FullFrameDetector

    warmed: list[tuple] = []
    real_warm_up = FrameEngine.warm_up
    monkeypatch.setattr(FrameEngine, "warm_up", lambda self, *a: (warmed.append(a), real_warm_up(self, *a))[1])
    cfg = RunConfig(source=["cam"], progress=False, max_persons=8)
    assemble(cfg, [Frames(2)], Stages(CUDA, FullFrameDetector(), {"pose": estimators["pose"]}), [Collect()],
             threading.Event())
    assert warmed == [(1, 1, ((100, 120),))]


# -- compiling ---------------------------------------------------------------------------------
def test_compiled_kernels_are_kept_per_gpu_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from stages.sapiens2.compiled import device_label

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    assert device_label(CUDA) == "NVIDIA-H200-NVL-sm90" and device_label(torch.device("cpu")) == "cpu"


def test_the_background_compile_runs_on_a_stream_of_its_own(gpu: FakeGpu) -> None:
    """stages/sapiens2/compiled.py on CUDA: the compile's input is made and run on its own stream, and
    it waits for that stream only (the stages go on on theirs)."""
    from stages.sapiens2.compiled import BackgroundCompile

    on: list[FakeStream] = []

    def make(shape: tuple[int, ...]):
        def compiled(x: torch.Tensor) -> tuple[torch.Tensor, None]:
            on.append(torch.cuda.current_stream())
            return x * 2.0, None
        return compiled

    def make_input(shape: tuple[int, ...]) -> torch.Tensor:
        on.append(torch.cuda.current_stream())
        return torch.zeros(shape)

    compiler = BackgroundCompile(make, make_input, CUDA, "pose")
    try:
        compiler.submit((1, 3, 4, 4))
        assert compiler.wait(timeout=120) and compiler.compiled_for((1, 3, 4, 4)) is not None
    finally:
        compiler.close()
    assert len(on) == 2 and on[0] is on[1] and on[0] is not gpu.default
    assert gpu.calls("stream.synchronize") == [("stream.synchronize", on[0])] and not gpu.calls("device.synchronize")


# -- the detector's device ---------------------------------------------------------------------
class Elsewhere(TwoPeople):
    """A YOLO detector built on another device than the stages (PersonDetector() without a device
    takes the current one, cuda:0, beside stages on cuda:1): it refuses frames that are not on its
    device, as PersonDetector.detect_tensors does."""

    device = CUDA

    def __init__(self) -> None:
        self.host_frames = 0

    def detect_tensors(self, images: list[torch.Tensor]) -> list[Detections]:
        raise ValueError(f"detector input is on {images[0].device}, the detector on {self.device}")

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        self.host_frames += len(images)
        return super().detect_batch(images)


def test_a_detector_on_another_device_than_the_frames_gets_them_from_the_host(estimators: dict) -> None:
    """The frames reach it through the host, at warm-up and on every step: the run goes on. (The
    stages run on the CPU here and the detector says cuda:0: the same mismatch, turned round.)"""
    detector = Elsewhere()
    engine = FrameEngine(Stages(torch.device("cpu"), detector, {"pose": estimators["pose"]}))
    engine.warm_up(max_persons=1, frame_sizes=((100, 120),))
    assert detector.host_frames == 1
    results = engine.finish_batch(engine.submit_batch(_step(0)), False)
    assert detector.host_frames == 3 and [len(r.detections) for r in results] == [2, 2]
    cpu = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pose": estimators["pose"]}))
    for got, expected in zip(results, cpu.finish_batch(cpu.submit_batch(_step(0)), False)):
        np.testing.assert_array_equal(got.keypoints.xy, expected.keypoints.xy)


def test_a_float16_dense_stage_falls_back_and_the_3d_step_runs_again_on_cuda(checkpoints: dict[str, Path],
                                                                             estimators: dict, gpu: FakeGpu,
                                                                             caplog) -> None:
    """pipeline/run/fallback.py: the pointmap overflows float16 (stood in for: its raw maps poisoned); it is
    computed again in bfloat16 and the 3D keypoints again on the new map, from this step's keypoints
    brought back to the device. The step's results are those of a bfloat16 pointmap from the start."""
    import logging

    def run(poisoned: bool) -> list[FrameResult]:
        pointmap = _estimator("pointmap", checkpoints["pointmap"], "float16")
        if poisoned:
            real = pointmap.forward

            def forward(pixels: torch.Tensor):
                maps, scale = real(pixels)
                if pointmap.model.dtype == torch.float16:
                    maps = maps.clone()
                    maps.view(-1)[0] = float("inf")
                return maps, scale

            pointmap.forward = forward
        else:
            pointmap.set_dtype(torch.bfloat16)
        engine = _engine({"pose": estimators["pose"], "pointmap": pointmap}, CUDA)
        with caplog.at_level(logging.WARNING, "pipeline.run.engine"):
            out = engine.finish_batch(engine.submit_batch(_step(0)), False)
        assert pointmap.model.dtype == torch.bfloat16
        return out

    clean, published = run(False), run(True)
    assert len([r for r in caplog.records if "float16 overflowed" in r.getMessage()]) == 1
    for got, want in zip(published, clean):
        assert np.isfinite(got.pointmap).all()
        np.testing.assert_array_equal(got.pointmap, want.pointmap)
        np.testing.assert_array_equal(got.keypoints3d.xyz, want.keypoints3d.xyz)
        np.testing.assert_array_equal(got.keypoints3d.valid, want.keypoints3d.valid)
