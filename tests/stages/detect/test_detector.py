"""Person detectors, offline: a random-weights YOLO on a real photo, failure modes, pickle safety,
ByteTrack ids, boxes carried between detector runs, and no device-wide synchronisation."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from stages.detect import DetectorError, FullFrameDetector
from stages.detect.tracking import ByteTracker, carry_boxes
from stages.detect.yolo import PersonDetector
from stages.types import Detections

ultralytics = pytest.importorskip("ultralytics")
BUS = Path(ultralytics.__file__).parent / "assets" / "bus.jpg"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def bus_rgb() -> np.ndarray:
    image = cv2.imread(str(BUS))
    assert image is not None, f"cannot read {BUS}"
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def yaml_detector() -> Iterator[PersonDetector]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("YOLO_OFFLINE", "1")
        yield PersonDetector("yolo11n.yaml", conf=0.01, max_persons=5, imgsz=320, device="cpu")


def _check_valid(det: Detections, height: int, width: int, max_n: int) -> None:
    assert isinstance(det, Detections)
    assert det.boxes.dtype == np.float32 and det.boxes.shape[1] == 4
    assert len(det) <= max_n
    assert det.scores.shape == (len(det),) and det.track_ids.shape == (len(det),)
    if len(det):
        assert np.all(det.boxes[:, 2] >= det.boxes[:, 0]) and np.all(det.boxes[:, 3] >= det.boxes[:, 1])
        assert det.boxes[:, [0, 2]].max() <= width + 1 and det.boxes[:, [1, 3]].max() <= height + 1


def test_yaml_model_runs_on_real_photo(yaml_detector: PersonDetector, bus_rgb: np.ndarray) -> None:
    import ultralytics.utils.checks as checks
    import ultralytics.utils.events as events

    assert yaml_detector.random_weights is True
    assert yaml_detector.half is False  # CPU: fp16 is never requested
    assert checks.AUTOINSTALL is False and events.events.enabled is False
    det = yaml_detector.detect(bus_rgb)
    _check_valid(det, *bus_rgb.shape[:2], max_n=5)
    assert np.all(det.track_ids == -1)


def test_detector_keeps_the_process_cpu_thread_count(yaml_detector: PersonDetector, bus_rgb: np.ndarray) -> None:
    """Ultralytics sets torch's CPU thread count on every predict; the pipeline's own setting stands."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        yaml_detector.detect(bus_rgb)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_batch_is_one_result_per_frame_in_order(yaml_detector: PersonDetector, bus_rgb: np.ndarray) -> None:
    small = np.ascontiguousarray(bus_rgb[:300, :200])
    batch = yaml_detector.detect_batch([bus_rgb, small])
    assert len(batch) == 2
    _check_valid(batch[0], *bus_rgb.shape[:2], max_n=5)
    _check_valid(batch[1], 300, 200, max_n=5)
    assert yaml_detector.detect_batch([]) == []


def test_byte_tracker_keeps_ids_while_people_move() -> None:
    tracker = ByteTracker(frame_rate=30)
    image = np.zeros((200, 300, 3), np.uint8)
    seen = []
    for t in range(8):
        boxes = np.array([[10 + 3 * t, 20, 60 + 3 * t, 150], [200 - 2 * t, 30, 260 - 2 * t, 180]], np.float32)
        det = tracker.update(Detections(boxes, np.array([0.9, 0.8], np.float32), np.full(2, -1)), image)
        if len(det):
            seen.append({int(i): float(b[0]) for i, b in zip(det.track_ids, det.boxes)})
    assert len(seen) >= 6 and all(len(s) == 2 for s in seen)
    ids = set(seen[0])
    assert all(set(s) == ids for s in seen), seen  # the same two ids on every frame
    left, right = sorted(ids, key=lambda i: seen[0][i])
    assert seen[-1][left] > seen[0][left] and seen[-1][right] < seen[0][right]  # each id follows its person
    tracker.reset()  # a new stream: tracks forgotten, ids start again
    for _ in range(3):
        fresh = tracker.update(Detections(np.array([[100, 20, 160, 150]], np.float32), [0.9], [-1]), image)
    assert fresh.track_ids.tolist() == [1]


@pytest.mark.parametrize("model", ["yolo11n.pt", "missing/dir/person.pt"])
def test_missing_weights_offline_fail_fast(model: str) -> None:
    start = time.monotonic()
    with pytest.raises(DetectorError) as info:
        PersonDetector(model)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{model} is not on this machine")
    for option in ("--detector-model PATH", "yolo11n.yaml", "--detector full-frame"):
        assert option in message


def test_missing_local_path_does_not_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("YOLO_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(DetectorError, match=r"no such file"):
        PersonDetector("/nonexistent/folder/yolo11n.pt")


def test_unknown_yaml() -> None:
    with pytest.raises(DetectorError, match="cannot build a detector from nope.yaml"):
        PersonDetector("nope.yaml")


@pytest.mark.parametrize(("kwargs", "message"), [({"max_persons": 0}, "max_persons"), ({"conf": 5}, "conf")])
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PersonDetector("yolo11n.yaml", **kwargs)


class _Evil:
    """Unpickling this creates a file: what a hostile .pt could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_is_not_loaded_unless_trusted(tmp_path: Path) -> None:
    import pickle

    evil, marker = tmp_path / "evil.pt", tmp_path / "code-ran"
    evil.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(DetectorError, match="pickle.*--trust-detector-model"):
        PersonDetector(str(evil))
    assert not marker.exists(), "the pickle was loaded without trust"
    with pytest.raises(DetectorError, match="cannot load detector weights"):
        PersonDetector(str(evil), trust=True)  # trusted: Ultralytics unpickles it (and it is no model)
    assert marker.exists(), "the hazard is real: a trusted pickle runs its code"


def test_an_official_name_in_the_current_folder_is_checked_too(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """yolo11n.pt in the current folder may be anybody's: it is read by the restricted unpickler first."""
    import pickle

    marker = tmp_path / "code-ran"
    (tmp_path / "yolo11n.pt").write_bytes(pickle.dumps(_Evil(marker)))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DetectorError, match=r"yolo11n.pt is a pickle that names (io|builtins).open.*--trust-detector"):
        PersonDetector("yolo11n.pt")
    assert not marker.exists(), "an official name was unpickled unchecked"


def test_a_real_ultralytics_checkpoint_loads_without_the_trust_flag(tmp_path: Path) -> None:
    """What Ultralytics itself saves (layers, tensors, metadata) passes the restricted unpickler, and
    the detector loaded from it works."""
    from ultralytics import YOLO

    saved = tmp_path / "mine.pt"
    YOLO("yolo11n.yaml").save(str(saved))
    detector = PersonDetector(str(saved))
    assert not detector.random_weights
    found = detector.detect(np.zeros((96, 128, 3), np.uint8))
    assert found.boxes.shape[1:] == (4,)


def test_bad_input(yaml_detector: PersonDetector) -> None:
    with pytest.raises(ValueError, match=r"expected \(H, W, 3\) uint8 RGB"):
        yaml_detector.detect(np.zeros((10, 10), np.uint8))


def test_full_frame_detector() -> None:
    det = FullFrameDetector().detect(np.zeros((48, 64, 3), np.uint8))
    np.testing.assert_array_equal(det.boxes, [[0, 0, 64, 48]])
    np.testing.assert_array_equal(det.scores, [1.0])
    np.testing.assert_array_equal(det.track_ids, [0])
    assert FullFrameDetector.random_weights is False


def test_carry_boxes() -> None:
    xy = torch.tensor(
        [
            [[10, 20], [30, 60], [500, 500]],  # third point is below threshold
            [[90, 90], [120, 95], [0, 0]],  # reaches past the right edge after the margin
            [[5, 5], [6, 6], [7, 7]],  # only one confident point: keeps its previous box
            [[float("nan"), 5], [6, 6], [7, 7]],  # a non-finite keypoint: keeps its previous box
        ],
        dtype=torch.float32,
    )
    scores = torch.tensor([[0.9, 0.9, 0.1], [0.9, 0.9, 0.0], [0.9, 0.0, 0.0], [0.9, 0.9, 0.9]])
    previous = torch.tensor([[0, 0, 1, 1], [0, 0, 2, 2], [1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.float32)
    wh = torch.tensor([[110, 100]] * 4, dtype=torch.float32)
    boxes = carry_boxes(xy, scores, threshold=0.3, frame_wh=wh, previous=previous, margin=0.1)
    assert boxes.shape == (4, 4) and boxes.dtype == torch.float32
    torch.testing.assert_close(boxes[0], torch.tensor([8.0, 16, 32, 64]))
    torch.testing.assert_close(boxes[1], torch.tensor([87.0, 89.5, 110, 95.5]))
    torch.testing.assert_close(boxes[2:], previous[2:])
    with pytest.raises(ValueError, match="carry_boxes"):
        carry_boxes(xy[0], scores, 0.3, wh, previous)


class _FakeBoxes:
    def __init__(self, xyxy: list, conf: list, ids: list | None) -> None:
        import torch

        self.xyxy = torch.tensor(xyxy, dtype=torch.float32)
        self.conf = torch.tensor(conf, dtype=torch.float32)
        self.id = None if ids is None else torch.tensor(ids, dtype=torch.float32)


class _FakeYolo:
    """Stands in for a trained YOLO (no weights offline) to check the conversion to Detections."""

    def __init__(self) -> None:
        self.calls = []

    def predict(self, image: np.ndarray, **kwargs: object) -> list:
        self.calls.append((image, kwargs))
        boxes = _FakeBoxes([[0, 0, 5, 5], [1, 1, 9, 9], [2, 2, 4, 4]], [0.3, 0.9, 0.6], None)
        return [type("Result", (), {"boxes": boxes})()]


def test_results_become_sorted_detections(yaml_detector: PersonDetector, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeYolo()
    monkeypatch.setattr(yaml_detector, "model", fake)
    monkeypatch.setattr(yaml_detector, "max_persons", 2)
    image = np.zeros((10, 10, 3), np.uint8)
    image[..., 0] = 255  # red in RGB must reach Ultralytics as BGR
    det = yaml_detector.detect(image)
    np.testing.assert_allclose(det.scores, [0.9, 0.6])
    np.testing.assert_array_equal(det.boxes, [[1, 1, 9, 9], [2, 2, 4, 4]])
    np.testing.assert_array_equal(det.track_ids, [-1, -1])
    sent, kwargs = fake.calls[0]
    assert sent[0, 0].tolist() == [0, 0, 255]
    assert kwargs["classes"] == [0] and kwargs["max_det"] == 2
    assert "half" not in kwargs  # deprecated in Ultralytics (a warning per call); fp16 is quantize=16


@pytest.mark.parametrize("half", [True, False])
def test_on_cuda_float16_is_asked_of_ultralytics_on_the_indexed_device(half: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU (its presence stood in for) the detector asks Ultralytics for float16 with quantize=16
    (its AutoBackend then runs the YOLO and takes its input in float16) on cuda:N, never plain cuda."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    detector = PersonDetector("yolo11n.yaml", imgsz=320, device="cuda", half=half)
    assert detector.device == torch.device("cuda", 0) and detector.half is half
    fake = _FakeYolo()
    monkeypatch.setattr(detector, "model", fake)
    detector.detect(np.zeros((10, 10, 3), np.uint8))
    kwargs = fake.calls[0][1]
    assert kwargs["device"] == torch.device("cuda", 0) and kwargs.get("quantize") == (16 if half else None)


def test_with_float16_asked_ultralytics_sets_its_predictor_up_once(bus_rgb: np.ndarray) -> None:
    """Ultralytics builds a new predictor (a deep copy of the YOLO, fused, warmed up) whenever a setup
    argument (device, quantize) differs from its predictor's: the float16 a GPU run asks for must
    compare equal call after call, on the host path and the device path. (Asked here on the CPU,
    where its AutoBackend ignores it: the comparison is the same.)"""
    detector = PersonDetector("yolo11n.yaml", conf=0.01, imgsz=320, device="cpu")
    detector.half = True  # as on CUDA
    detector.detect(bus_rgb)
    predictor = detector.model.predictor
    detector.detect(bus_rgb)
    detector.detect_tensors([torch.from_numpy(bus_rgb).permute(2, 0, 1).contiguous()])
    assert detector.model.predictor is predictor and predictor.args.quantize == 16


def test_detect_does_not_synchronise_the_device(monkeypatch) -> None:
    """Ultralytics' step timer calls a device-wide synchronize; inside detect() it must not, and only
    on the thread that is detecting: another thread's timer still synchronises meanwhile."""
    import threading

    import ultralytics.utils.ops as ops

    from stages.detect.yolo import _no_device_sync

    calls = []

    class FakeBackend:
        def synchronize(self, device) -> None:
            calls.append(threading.current_thread().name)

    profile = ops.Profile()
    profile.accelerator = FakeBackend()  # as on a CUDA device
    profile.time()
    assert calls, "the unpatched timer synchronises (the hazard is real)"
    calls.clear()
    with _no_device_sync():
        with profile:
            pass
        other = threading.Thread(target=profile.time, name="other")
        other.start()
        other.join()
    assert calls == ["other"]  # only the other thread synchronised
    profile.time()
    assert calls == ["other", threading.current_thread().name]  # and ours again afterwards


def test_the_run_device_reaches_the_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.cli.config import RunConfig
    from pipeline.run.build import build_detector

    cfg = RunConfig(source="demo", detector="yolo", detector_model="yolo11n.yaml", det_imgsz=320)
    detector = build_detector(cfg, torch.device("cpu"), [])
    assert isinstance(detector, PersonDetector) and detector.device == torch.device("cpu")
    fake = _FakeYolo()
    monkeypatch.setattr(detector, "model", fake)
    detector.detect(np.zeros((32, 32, 3), np.uint8))
    assert [kwargs["device"] for _, kwargs in fake.calls] == [torch.device("cpu")]


@pytest.mark.parametrize("path", ["host frames", "device frames"])
def test_the_device_check_reads_the_module_that_runs(path: str, bus_rgb: np.ndarray, caplog) -> None:
    """As on a GPU: Ultralytics' predictor runs a deep copy of the YOLO on the device, while the wrapper's
    own module stays where it was built (2026-12-04: "the detector ran on cpu, not on the requested cuda:0"
    ended every CUDA run at its first frame). Here the wrapper's module is moved away (to meta) once the
    predictor is set up; the one that runs is on the requested device, and the run goes on."""
    detector = PersonDetector("yolo11n.yaml", conf=0.01, imgsz=320, device="cpu")
    detector.detect(bus_rgb)  # the predictor is set up (its AutoBackend holds its own copy)
    detector.model.model.to("meta")
    detector._checked_device = False
    with caplog.at_level(logging.WARNING):
        if path == "host frames":
            found = detector.detect(bus_rgb)
        else:
            found = detector.detect_tensors([torch.from_numpy(bus_rgb).permute(2, 0, 1).contiguous()])[0]
    assert detector.inference_device() == torch.device("cpu") and "not on the requested" not in caplog.text
    _check_valid(found, *bus_rgb.shape[:2], 16)


def test_a_detector_running_elsewhere_warns_once_and_takes_the_frames_through_the_host(
        bus_rgb: np.ndarray, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """Ultralytics put the model on another device than asked (cuda:0 for cuda:1): device frames would
    meet it on the wrong device; they go through the host instead, with one warning, never an error."""
    detector = PersonDetector("yolo11n.yaml", conf=0.01, imgsz=320, device="cpu")
    host = detector.detect(bus_rgb)
    monkeypatch.setattr(detector, "inference_device", lambda: torch.device("cuda", 1))
    detector._checked_device = False
    frames = [torch.from_numpy(bus_rgb).permute(2, 0, 1).contiguous()] * 2
    with caplog.at_level(logging.WARNING):
        found = detector.detect_tensors(frames) + detector.detect_tensors(frames)
    warnings = [r.getMessage() for r in caplog.records if "requested" in r.getMessage()]
    assert len(warnings) == 1 and "runs on cuda:1, not on the requested cpu" in warnings[0]
    for det in found:
        np.testing.assert_array_equal(det.boxes, host.boxes)


def test_a_cuda_device_becomes_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """pick_device makes cuda:N the current device, so a library that says just "cuda" lands there;
    an index past the devices is one error. (CUDA's own calls are stood in for on this CPU machine.)"""
    from pipeline.run.build import pick_device
    from stages.sapiens2.weights import CheckpointError

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: chosen[-1] if chosen else 0)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert pick_device("cuda:1") == torch.device("cuda", 1) and chosen == [1]
    assert pick_device("cuda") == torch.device("cuda", 1)  # the current one, kept current
    with pytest.raises(CheckpointError, match="only 2 CUDA device"):
        pick_device("cuda:2")
