"""The GPU path's logic, run on the CPU: CUDA graphs on by default on CUDA, warm-up on the replaying
stream, fullgraph compiles, detect_every under pipelining, float16 overflow where real models show
it (the MLP) falling back to bfloat16, and a hardware-encoder probe that gives NVENC what it needs."""

from __future__ import annotations

import contextlib
import logging
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from pipeline.run.runner import Runner
from stages.detect.tracking import carry_boxes
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import NonFiniteOutputError, estimator_for
from stages.sapiens2.fastpath import FastPath, compile_captures_cuda_graphs
from stages.sapiens2.forward import FastForward
from stages.sapiens2.model import Sapiens2
from stages.sapiens2.tiny import make_tiny, random_init, tiny_config, write_checkpoint
from stages.types import Detections, Frame, StreamInfo

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pose_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("pose"), "pose", image_size=(64, 48))


# -- CUDA graphs, compile ------------------------------------------------------------------
@pytest.mark.parametrize("mode, graphs", [("off", False), ("default", False), ("reduce-overhead", True),
                                          ("max-autotune", True), ("max-autotune-no-cudagraphs", False)])
def test_which_compile_modes_are_made_for_cuda_graphs(mode: str, graphs: bool) -> None:
    assert compile_captures_cuda_graphs(mode) is graphs


def test_cuda_graphs_are_on_by_default_on_cuda_only(caplog) -> None:
    """Resolved against a model on a CUDA device (no GPU needed: only its device is read)."""
    on_gpu, on_cpu = SimpleNamespace(device=torch.device("cuda", 0)), SimpleNamespace(device=torch.device("cpu"))
    assert FastPath().resolve(on_gpu).graphs and FastPath(cuda_graphs="on").resolve(on_gpu).graphs
    assert not FastPath(cuda_graphs="off").resolve(on_gpu).graphs
    assert not FastPath().resolve(on_cpu).graphs and "cuda_graphs='on' needs CUDA" not in caplog.text
    with caplog.at_level(logging.WARNING):
        assert FastPath(cuda_graphs="on").resolve(on_cpu).cuda_graphs == "off"  # one warning, not an error
    assert "cuda_graphs='on' needs CUDA; off on cpu" in caplog.text


def test_compile_is_fullgraph(pose_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: (seen.append(kw), model)[1])
    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"), fastpath=FastPath(compile="default"))
    assert not seen  # nothing compiles before the warm-up: the stage starts eager
    pose.warmup(max_batch=1)
    assert pose.wait_compiled(timeout=60)
    assert seen and seen[0]["fullgraph"] is True and seen[0]["dynamic"] is False
    pose.close()


def _lanes_in_use(engine: FrameEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The engine's streams.use recorded: the returned list holds the lanes entered, innermost last."""
    current: list[str] = []

    @contextlib.contextmanager
    def stream(name: str):
        current.append(name)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(engine.streams, "use", stream)
    return current


def test_warm_up_runs_each_stage_on_the_stream_that_replays_it(pose_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seg = estimator_for("seg")(load_model(make_tiny(tmp_path / "seg", "seg", image_size=(64, 48)), device="cpu"))
    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"))
    engine = FrameEngine(Stages(torch.device("cpu"), None, {"pose": pose, "seg": seg}))
    current = _lanes_in_use(engine, monkeypatch)
    ran: dict[str, tuple[str | None, int]] = {}
    for task, est in (("pose", pose), ("seg", seg)):
        monkeypatch.setattr(est, "warmup", lambda n, task=task: (ran.__setitem__(task, (current[-1] if current
                                                                                          else None, n)), 1.0)[1])
    assert engine.warm_up(max_persons=5, max_frames=3) == {"pose": 1.0, "seg": 1.0}
    assert ran == {"pose": ("pose", 5), "seg": ("seg", 3)}  # each on its own stage's stream, with its batch sizes


def test_warm_up_runs_the_detector_on_its_lane_once_per_frame_size(pose_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector on device frames is warmed before the first frame: one call per distinct source size,
    on the detect lane, with a device frame as the engine uploads it."""
    seen: list[tuple[str | None, tuple[int, ...], torch.dtype]] = []

    class DeviceDetector:
        random_weights = False

        def __init__(self) -> None:
            self.streams: list[str] = []  # the engine's lanes in use, innermost last

        def detect_tensors(self, images):
            seen.extend((self.streams[-1] if self.streams else None, tuple(im.shape), im.dtype) for im in images)
            return [Detections.empty() for _ in images]

    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"))
    monkeypatch.setattr(pose, "warmup", lambda n: 0.5)
    detector = DeviceDetector()
    engine = FrameEngine(Stages(torch.device("cpu"), detector, {"pose": pose}))
    detector.streams = _lanes_in_use(engine, monkeypatch)
    seconds = engine.warm_up(max_persons=2, frame_sizes=((48, 64), (30, 40), (48, 64)))
    assert sorted(seen) == [("detect", (3, 30, 40), torch.uint8), ("detect", (3, 48, 64), torch.uint8)]
    assert set(seconds) == {"detect", "pose"} and seconds["pose"] == 0.5
    seen.clear()
    assert engine.warm_up(max_persons=2) == {"pose": 0.5} and not seen  # no sizes given: nothing to warm


# -- detect_every under pipelining ---------------------------------------------------------
class _ByCall:
    """A detector whose answer depends on how often it was called (``calls``, counted per image)."""

    random_weights = False

    def __init__(self) -> None:
        self.calls = 0

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        out = []
        for _ in images:
            out.append(self.detections(self.calls))
            self.calls += 1
        return out


class OrderedPeople(_ByCall):
    """Three people, returned in a score order that changes every call (as a detector re-sorts)."""

    def detections(self, call: int) -> Detections:
        boxes = np.array([[5, 5, 40, 60], [50, 10, 90, 70], [20, 30, 70, 95]], np.float32)
        order = np.roll(np.arange(3), call)  # a different order each run
        return Detections(boxes[order], np.array([0.9, 0.8, 0.7], np.float32), np.array([11, 22, 33])[order])


class Frames:
    """A source whose next frame is always waiting, then ends (no timing in the test)."""

    frames_dropped = reopens = 0

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.frames = [Frame(i, rng.integers(0, 255, (100, 120, 3), dtype=np.uint8), i, Fraction(1, 30),
                             time.time_ns(), "cam") for i in range(n)]
        self.info = StreamInfo("cam", 120, 100, 30.0, Fraction(1, 30), live=False)
        self.frame_count = n

    def read(self, timeout: float):
        from pipeline.sources import SourceEnded

        if not self.frames:
            raise SourceEnded("end")
        return self.frames.pop(0)

    def stop(self) -> None:
        pass


class Collect:
    def __init__(self) -> None:
        self.results = []

    def open(self, info) -> None:
        pass

    def write(self, result) -> None:
        self.results.append(result)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("pipelined", [False, True])
def test_detect_every_keeps_boxes_scores_and_ids_with_their_person(pose_dir: Path, pipelined: bool) -> None:
    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"))
    detector = OrderedPeople()
    engine = FrameEngine(Stages(torch.device("cpu"), detector, {"pose": pose}), kpt_threshold=0.0, detect_every=3)
    sink = Collect()
    stats = Runner(Frames(9), engine, [sink], None, False, pipelined=pipelined).run()
    assert stats.error is None, stats.error
    results = sink.results
    assert len(results) == 9 and detector.calls == 3  # the detector ran on frames 0, 3 and 6 only
    for t, result in enumerate(results):
        det = result.detections
        if t % 3 == 0:
            continue
        before = results[t - 1]
        # Carried from the frame before, person by person: the same ids and scores in the same rows,
        # boxes made from that person's keypoints (not the previous frame's order of anybody else).
        np.testing.assert_array_equal(det.track_ids, before.detections.track_ids)
        np.testing.assert_array_equal(det.scores, before.detections.scores)
        wh = torch.tensor([[120.0, 100.0]] * len(det))
        want = carry_boxes(torch.from_numpy(before.keypoints.xy), torch.from_numpy(before.keypoints.scores), 0.0,
                           wh, torch.from_numpy(before.detections.boxes))
        np.testing.assert_allclose(det.boxes, want.numpy(), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(results[3].detections.track_ids, [33, 11, 22])  # a fresh detection re-sorts


class LeavesAfterFrame0(_ByCall):
    """One person in the first frame the detector sees, nobody afterwards."""

    def detections(self, call: int) -> Detections:
        n = 1 if call == 0 else 0
        return Detections(np.array([[5, 5, 40, 60]], np.float32)[:n], np.array([0.9], np.float32)[:n],
                          np.array([7])[:n])


@pytest.mark.parametrize("pipelined", [False, True])
def test_detect_every_drops_a_person_the_detector_no_longer_sees(pose_dir: Path, pipelined: bool) -> None:
    """Boxes are carried only from a detection that found somebody: a person who left is not brought back
    on the frames between detections."""
    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"))
    engine = FrameEngine(Stages(torch.device("cpu"), LeavesAfterFrame0(), {"pose": pose}), kpt_threshold=0.0,
                         detect_every=3)
    sink = Collect()
    stats = Runner(Frames(9), engine, [sink], None, False, pipelined=pipelined).run()
    assert stats.error is None, stats.error
    assert [len(r.detections) for r in sink.results] == [1, 1, 1, 0, 0, 0, 0, 0, 0]


# -- float16: overflow in the MLP falls back to bfloat16 ----------------------------------------
@pytest.fixture(scope="module")
def hot_mlp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pose model whose middle MLP (w3) outputs values beyond the float16 range, as the
    "massive activations" of large ViTs do; float32 and bfloat16 hold them."""
    model = random_init(Sapiens2(tiny_config("pose", image_size=(64, 48))), seed=5)
    with torch.no_grad():
        model.backbone.blocks[1].ffn.w3.weight.mul_(1e5)
    return write_checkpoint(model, tmp_path_factory.mktemp("hot-mlp"))


def _frame(i: int) -> Frame:
    image = np.random.default_rng(i).integers(0, 255, (100, 120, 3), dtype=np.uint8)
    return Frame(i, image, i, None, time.time_ns(), "cam")


class TwoPeople:
    random_weights = False

    def detect_batch(self, images):
        return [Detections(np.array([[10, 10, 60, 90], [50, 20, 110, 95]], np.float32), [0.9, 0.8], [0, 1])
                for _ in images]


def test_float16_mlp_overflow_falls_back_to_bfloat16_once(hot_mlp_dir: Path, caplog) -> None:
    half = load_model(hot_mlp_dir, device="cpu", dtype="float16")
    pixels = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        hidden = half.backbone.blocks[1].ffn(half.backbone.blocks[1].ln2(torch.randn(1, 57, 64), torch.float16))
    assert not torch.isfinite(hidden).all(), "the test model does not overflow float16 in the MLP"
    full = load_model(hot_mlp_dir, device="cpu", dtype="float32")
    with torch.inference_mode():
        assert torch.isfinite(full(pixels)[0]).all()  # the overflow is float16's, not the model's
    pose = estimator_for("pose")(half)
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pose": pose}))
    with caplog.at_level(logging.WARNING, "pipeline.run.engine"):
        first = engine.finish(engine.submit(_frame(0)), False)
        second = engine.finish(engine.submit(_frame(1)), False)
    assert pose.model.dtype == torch.bfloat16
    for result in (first, second):
        assert np.isfinite(result.keypoints.xy).all() and np.isfinite(result.keypoints.scores).all()
    warnings = [r for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(warnings) == 1  # said once
    again = engine.finish(engine.submit(_frame(0)), False)  # frame 0 in bfloat16 from the start
    np.testing.assert_allclose(first.keypoints.xy, again.keypoints.xy, atol=1e-3)


def test_float16_fall_back_when_the_next_step_is_already_queued(hot_mlp_dir: Path, caplog,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined (as on CUDA): step 1 was submitted in float16 before step 0 found the overflow; it is run
    again in bfloat16 too, not taken for a bfloat16 failure."""
    pose = estimator_for("pose")(load_model(hot_mlp_dir, device="cpu", dtype="float16"))
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pose": pose}))
    # an overflow the warm-up's check picture does not show (that one switches float16 off before any frame)
    monkeypatch.setattr(FastForward, "_float16_disagrees", lambda self, pixels: None)
    warmed = []  # the dtype of each warm-up: compiled and CUDA graphs of bfloat16 are made at the switch too
    real_warmup = pose.warmup
    pose.warmup = lambda n: warmed.append(pose.model.dtype) or real_warmup(n)
    engine.warm_up(max_persons=2)
    with caplog.at_level(logging.WARNING, "pipeline.run.engine"):
        first, second = engine.submit(_frame(0)), engine.submit(_frame(1))
        results = [engine.finish(first, False), engine.finish(second, False)]
    assert pose.model.dtype == torch.bfloat16
    for result in results:
        assert np.isfinite(result.keypoints.xy).all() and np.isfinite(result.keypoints.scores).all()
    assert len([r for r in caplog.records if "bfloat16" in r.getMessage()]) == 1
    assert warmed == [torch.float16, torch.bfloat16]
    again = engine.finish(engine.submit(_frame(1)), False)
    np.testing.assert_allclose(results[1].keypoints.xy, again.keypoints.xy, atol=1e-3)


def test_float16_fall_back_on_cuda_changes_the_weights_only_when_no_stream_reads_them(
        hot_mlp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (streams and events stood in for: tests/fakecuda.py), the next step is queued in float16
    on the pose lane when this one overflows: the cast waits for the device (torch.cuda.synchronize
    with the engine's own device), and the queued step is computed again in bfloat16."""
    import pipeline.run.streams
    from tests.fakecuda import FakeGpu

    gpu = FakeGpu(monkeypatch)
    monkeypatch.setattr(pipeline.run.streams, "_STREAMS", {})
    pose = estimator_for("pose")(load_model(hot_mlp_dir, device="cpu", dtype="float16"))
    monkeypatch.setattr(FastForward, "_float16_disagrees", lambda self, pixels: None)
    engine = FrameEngine(Stages(torch.device("cuda", 0), TwoPeople(), {"pose": pose}))
    engine.warm_up(max_persons=2)
    idle_at_cast = []
    real_set_dtype = pose.set_dtype
    monkeypatch.setattr(pose, "set_dtype", lambda dtype: (idle_at_cast.append(all(s.query() for s in gpu.streams)),
                                                          real_set_dtype(dtype))[1])
    first, second = engine.submit(_frame(0)), engine.submit(_frame(1))
    results = [engine.finish(first, False), engine.finish(second, False)]
    assert pose.model.dtype == torch.bfloat16 and idle_at_cast == [True]
    assert [call[1] for call in gpu.calls("device.synchronize")] == [torch.device("cuda", 0)] * 2
    for result in results:
        assert np.isfinite(result.keypoints.xy).all() and np.isfinite(result.keypoints.scores).all()


def test_non_finite_outside_float16_stops_the_run(hot_mlp_dir: Path, tmp_path: Path) -> None:
    model = random_init(Sapiens2(tiny_config("pose", image_size=(64, 48))), seed=1)
    with torch.no_grad():
        model.decode_head.predictor.weight.fill_(float("nan"))
    folder = write_checkpoint(model, tmp_path / "nan")
    pose = estimator_for("pose")(load_model(folder, device="cpu", dtype="float32"))
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pose": pose}))
    with pytest.raises(NonFiniteOutputError, match="pose: the model produced non-finite values") as raised:
        engine.finish(engine.submit(_frame(0)), False)
    # in float32 there is no wider dtype to try: the advice is about the checkpoint only
    assert "its weights hold NaN/Inf" in str(raised.value) and "--dtype" not in str(raised.value)


def test_pointmap_scale_is_checked(tmp_path: Path) -> None:
    model = random_init(Sapiens2(tiny_config("pointmap", image_size=(128, 96))), seed=2)
    with torch.no_grad():
        model.decode_head.scale_final_layer[-1].bias.fill_(float("inf"))  # only the scale branch breaks
    folder = write_checkpoint(model, tmp_path / "scale")
    est = estimator_for("pointmap")(load_model(folder, device="cpu", dtype="float32"))
    _, checked = est.run(est.image_tensor(np.zeros((96, 128, 3), np.uint8)))
    assert any(not torch.isfinite(t).all() for t in checked)
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pointmap": est}))
    with pytest.raises(NonFiniteOutputError, match="pointmap"):
        engine.finish(engine.submit(_frame(0)), False)


def test_a_frame_whose_scale_is_zero_has_invalid_3d_points_and_the_run_goes_on(pose_dir: Path, tmp_path: Path) -> None:
    """The model's outputs are finite; only the map divided by its scale (0) is not: that frame's 3D points are
    invalid zeros, which is not a broken model (the run does not stop)."""
    from stages.keypoints3d import Lift

    model = random_init(Sapiens2(tiny_config("pointmap", image_size=(128, 96))), seed=2)
    with torch.no_grad():
        model.decode_head.scale_final_layer[-1].weight.zero_()
        model.decode_head.scale_final_layer[-1].bias.zero_()
    pointmap = estimator_for("pointmap")(load_model(write_checkpoint(model, tmp_path / "zero-scale"), device="cpu"))
    pose = estimator_for("pose")(load_model(pose_dir, device="cpu"))
    engine = FrameEngine(Stages(torch.device("cpu"), TwoPeople(), {"pose": pose, "pointmap": pointmap}),
                         keypoints3d=Lift(threshold=0.0))
    result = engine.finish(engine.submit(_frame(0)), False)
    assert not np.isfinite(result.pointmap).all()  # the degenerate prediction itself
    k3 = result.keypoints3d
    assert k3.xyz.shape == (2, 308, 3) and not k3.valid.any() and not k3.root_valid.any()
    assert not k3.xyz.any() and np.isfinite(k3.root).all()


# -- the hardware encoder probe ------------------------------------------------------------
def test_encoder_probe_sets_the_frame_rate_nvenc_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import av
    from sapiens2_client import video

    opened: list[dict] = []

    class Context:
        def open(self) -> None:
            opened.append(dict(vars(self)))

    monkeypatch.setattr(av.CodecContext, "create", lambda name, mode: Context())
    assert video.probe_encoder("h264_nvenc", 640, 480, Fraction(30000, 1001))
    assert opened[0]["framerate"] == Fraction(30000, 1001) and opened[0]["time_base"] == Fraction(1001, 30000)
