"""Person detectors, offline: a random-weights YOLO on a real photo, failure modes, carrying boxes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from stages.detector import (
    DetectorError,
    FullFrameDetector,
    PersonDetector,
    boxes_from_keypoints,
)
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


def test_tracker_path_runs(bus_rgb: np.ndarray) -> None:
    detector = PersonDetector("yolo11n.yaml", conf=0.01, imgsz=320, device="cpu", track=True)
    for _ in range(3):
        det = detector.detect(bus_rgb)
        _check_valid(det, *bus_rgb.shape[:2], max_n=16)
    detector.reset()
    _check_valid(detector.detect(bus_rgb), *bus_rgb.shape[:2], max_n=16)


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


@pytest.mark.parametrize(("kwargs", "message"), [({"every_n": 0}, "every_n"), ({"max_persons": 0}, "max_persons")])
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PersonDetector("yolo11n.yaml", **kwargs)


def test_bad_input(yaml_detector: PersonDetector) -> None:
    with pytest.raises(ValueError, match=r"expected \(H, W, 3\) uint8 RGB"):
        yaml_detector.detect(np.zeros((10, 10), np.uint8))


def test_every_n_uses_carried_boxes(yaml_detector: PersonDetector, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    found = Detections(np.array([[10, 10, 50, 90], [60, 5, 99, 95]], np.float32), [0.9, 0.8], [7, 8])

    def fake_run(image: np.ndarray) -> Detections:
        calls.append(1)
        return found

    monkeypatch.setattr(yaml_detector, "_run", fake_run)
    monkeypatch.setattr(yaml_detector, "every_n", 3)
    yaml_detector.reset()
    image = np.zeros((100, 100, 3), np.uint8)
    assert len(yaml_detector.detect(image)) == 2 and len(calls) == 1  # frame 0: detector
    moved = found.boxes + 1
    moved[1] = np.nan  # lost person: dropped from the carried set
    yaml_detector.carry(moved)
    det = yaml_detector.detect(image)  # frame 1: carried
    assert len(calls) == 1
    np.testing.assert_array_equal(det.boxes, moved[:1])
    np.testing.assert_array_equal(det.track_ids, [7])
    yaml_detector.detect(image)  # frame 2: nothing carried since -> detector runs
    assert len(calls) == 2
    yaml_detector.detect(image)  # frame 3: scheduled run
    assert len(calls) == 3
    yaml_detector.reset()


def test_full_frame_detector() -> None:
    det = FullFrameDetector().detect(np.zeros((48, 64, 3), np.uint8))
    np.testing.assert_array_equal(det.boxes, [[0, 0, 64, 48]])
    np.testing.assert_array_equal(det.scores, [1.0])
    np.testing.assert_array_equal(det.track_ids, [0])
    assert FullFrameDetector.random_weights is False


def test_boxes_from_keypoints() -> None:
    xy = np.array(
        [
            [[10, 20], [30, 60], [500, 500]],  # third point is below threshold
            [[90, 90], [120, 95], [0, 0]],  # reaches past the right edge after the margin
            [[5, 5], [6, 6], [7, 7]],  # only one confident point
        ],
        np.float32,
    )
    scores = np.array([[0.9, 0.9, 0.1], [0.9, 0.9, 0.0], [0.9, 0.0, 0.0]], np.float32)
    boxes = boxes_from_keypoints(xy, scores, threshold=0.3, image_size=(100, 110), margin=0.1)
    assert boxes.shape == (3, 4) and boxes.dtype == np.float32
    np.testing.assert_allclose(boxes[0], [8, 16, 32, 64])
    np.testing.assert_allclose(boxes[1], [87, 89.5, 110, 95.5])
    assert np.isnan(boxes[2]).all()
    with pytest.raises(ValueError, match="boxes_from_keypoints"):
        boxes_from_keypoints(xy[0], scores, 0.3, (100, 100))


class _FakeBoxes:
    def __init__(self, xyxy: list, conf: list, ids: list | None) -> None:
        import torch

        self.xyxy = torch.tensor(xyxy, dtype=torch.float32)
        self.conf = torch.tensor(conf, dtype=torch.float32)
        self.id = None if ids is None else torch.tensor(ids, dtype=torch.float32)


class _FakeYolo:
    """Stands in for a trained YOLO (no weights offline) to check the conversion to Detections."""

    def __init__(self, ids: list | None) -> None:
        self.ids, self.calls = ids, []

    def _result(self, image: np.ndarray, **kwargs: object) -> list:
        self.calls.append((image, kwargs))
        boxes = _FakeBoxes([[0, 0, 5, 5], [1, 1, 9, 9], [2, 2, 4, 4]], [0.3, 0.9, 0.6], self.ids)
        return [type("Result", (), {"boxes": boxes})()]

    predict = _result
    track = _result


@pytest.mark.parametrize("track", [False, True])
def test_results_become_sorted_detections(
    yaml_detector: PersonDetector, monkeypatch: pytest.MonkeyPatch, track: bool
) -> None:
    fake = _FakeYolo([4, 5, 6] if track else None)
    monkeypatch.setattr(yaml_detector, "model", fake)
    monkeypatch.setattr(yaml_detector, "track", track)
    monkeypatch.setattr(yaml_detector, "max_persons", 2)
    yaml_detector.reset()
    image = np.zeros((10, 10, 3), np.uint8)
    image[..., 0] = 255  # red in RGB must reach Ultralytics as BGR
    det = yaml_detector.detect(image)
    np.testing.assert_allclose(det.scores, [0.9, 0.6])
    np.testing.assert_array_equal(det.boxes, [[1, 1, 9, 9], [2, 2, 4, 4]])
    np.testing.assert_array_equal(det.track_ids, [5, 6] if track else [-1, -1])
    sent, kwargs = fake.calls[0]
    assert sent[0, 0].tolist() == [0, 0, 255]
    assert kwargs["classes"] == [0] and kwargs["max_det"] == 2
    if track:
        assert kwargs["persist"] is True and kwargs["tracker"] == "bytetrack.yaml"
    yaml_detector.reset()


def test_detect_does_not_synchronise_the_device(monkeypatch) -> None:
    """Ultralytics' step timer calls a device-wide synchronize; inside detect() it must not."""
    import ultralytics.utils.ops as ops

    from stages.detector import _no_device_sync

    calls = []

    class FakeBackend:
        def synchronize(self, device) -> None:
            calls.append(device)

    profile = ops.Profile()
    profile.accelerator = FakeBackend()  # as on a CUDA device
    profile.time()
    assert calls, "the unpatched timer synchronises (the hazard is real)"
    calls.clear()
    with _no_device_sync():
        with profile:
            pass
    assert not calls
    profile.time()
    assert calls  # restored afterwards
