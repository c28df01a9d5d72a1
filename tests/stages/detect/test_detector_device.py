"""The YOLO detector on frames already on the device (stages.detect.letterbox), run here on the CPU:
Ultralytics' letterbox geometry redone in torch, the same boxes as the host path, and each frame
turned into a tensor once per step (on a GPU: one upload, which the detector shares)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from stages.detect.letterbox import PAD_VALUE, letterbox, letterbox_geometry
from stages.detect.yolo import PersonDetector
from stages.types import Frame

ultralytics = pytest.importorskip("ultralytics")
from ultralytics.data.augment import LetterBox

BUS = Path(ultralytics.__file__).parent / "assets" / "bus.jpg"
# (h, w): no resize, integer scale factors (identical to OpenCV), and other ratios down and up
EXACT = [(300, 640), (480, 640), (600, 1280), (1080, 1920)]
OTHER = [(700, 1000), (1080, 810), (333, 500), (1080, 1080)]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _bus(hw: tuple[int, int]) -> np.ndarray:
    image = cv2.cvtColor(cv2.imread(str(BUS)), cv2.COLOR_BGR2RGB)
    return np.ascontiguousarray(cv2.resize(image, hw[::-1], interpolation=cv2.INTER_AREA))


def _chw(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image).permute(2, 0, 1)  # (3, H, W) as the engine's uploaded frames


@pytest.mark.parametrize("auto", [True, False])
@pytest.mark.parametrize("hw", EXACT + OTHER)
def test_the_device_letterbox_is_ultralytics_letterbox(hw: tuple[int, int], auto: bool) -> None:
    image = _bus(hw)
    want = LetterBox((640, 640), auto=auto, stride=32)(image=image).astype(np.float32)  # (h, w, 3)
    geometry = letterbox_geometry(hw, 640, auto, 32)
    got = letterbox(_chw(image), geometry).permute(1, 2, 0).numpy()
    assert got.shape == want.shape == (*geometry.out_hw, 3)
    g = geometry
    border = np.ones(want.shape[:2], bool)
    border[g.top:g.top + g.resized_hw[0], g.left:g.left + g.resized_hw[1]] = False
    assert (want[border] == PAD_VALUE).all() and (got[border] == PAD_VALUE).all()  # the same place, grey
    diff = np.abs(got - want)
    if hw in EXACT:
        assert diff.max() == 0
    else:  # OpenCV's fixed-point bilinear vs float rounded: one grey level at most, on few pixels
        assert diff.max() <= 1.0 and (diff > 0).mean() < 0.2


@pytest.fixture(scope="module")
def sharp_detector() -> Iterator[PersonDetector]:
    yield _sharp()


def _sharp() -> PersonDetector:
    """A random-weights YOLO11n whose outputs depend on the picture: He-initialised convolutions and
    a steep person logit, the other classes' at 0 (Ultralytics' own init gives every box the same
    tiny score): scores spread over 0.5..0.98."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("YOLO_OFFLINE", "1")
        detector = PersonDetector("yolo11n.yaml", conf=0.9, max_persons=50, imgsz=320, device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in detector.model.model.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * math.sqrt(2.0 / m.weight[0].numel()))
                if m.bias is not None:
                    m.bias.zero_()
        for branch in detector.model.model.model[-1].cv3:  # the class logits
            branch[-1].weight[1:] = 0.0
            branch[-1].weight[0] *= 100.0
    return detector


def _match(a, b, exact: bool, conf: float = 0.9) -> None:
    """Every box of one has a box of the other within 1e-3 px and its score within 1e-6 (float
    rounding) when the inputs are identical; else within 0.05 px and 2e-3 (the steep test logit
    amplifies a grey level), and a box scored within 0.01 of the threshold may be on one side only."""
    atol, stol, margin = (1e-3, 1e-6, 0.0) if exact else (0.05, 2e-3, 0.01)
    assert len(a) == len(b) if exact else abs(len(a) - len(b)) <= max(1, len(a) // 10), (len(a), len(b))
    for boxes, scores, other in ((a.boxes, a.scores, b), (b.boxes, b.scores, a)):
        for box, score in zip(boxes, scores):
            if score < conf + margin:
                continue
            assert len(other), "a confident box has no counterpart"
            err = np.abs(other.boxes - box).max(axis=1)
            j = int(err.argmin())
            assert err[j] <= atol and abs(other.scores[j] - score) <= stol, (box, score, other.boxes[j], other.scores[j])


@pytest.mark.parametrize("hw", EXACT[:3] + OTHER[:3])
def test_the_device_path_finds_the_host_paths_boxes(sharp_detector: PersonDetector, hw: tuple[int, int]) -> None:
    image = _bus(hw)
    host = sharp_detector.detect_batch([image])[0]
    device = sharp_detector.detect_tensors([_chw(image)])[0]
    assert len(host) > 0, "the test detector finds nothing: the comparison would be empty"
    assert host.boxes[:, [0, 2]].max() <= hw[1] and host.boxes[:, [1, 3]].max() <= hw[0]  # frame pixels
    _match(host, device, exact=hw in EXACT)


def test_a_batch_of_frames_of_two_sizes_gives_each_its_own_boxes(sharp_detector: PersonDetector) -> None:
    images = [_bus((600, 1280)), _bus((700, 1000))]  # different sizes: square letterbox, as the host path
    host = sharp_detector.detect_batch(images)
    device = sharp_detector.detect_tensors([_chw(i) for i in images])
    assert len(device) == 2 and sum(len(d) for d in host) > 0
    for h, d in zip(host, device):
        _match(h, d, exact=False)
    assert sharp_detector.detect_tensors([]) == []


def test_in_float16_the_device_path_finds_the_host_paths_boxes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, quantize=16 makes Ultralytics' AutoBackend hold the YOLO in float16 and take float16
    input; on the CPU it never does, so here the backend is switched to float16 as a GPU has it. The
    device path's letterbox, made float16 as the host path's is, finds the same boxes."""
    detector = _sharp()
    image = _bus((480, 640))  # an integer scale factor: both letterboxes give the same pixels
    detector.detect_batch([image])  # Ultralytics sets its predictor (and AutoBackend) up
    predictor = detector.model.predictor
    predictor.model.backend.fp16 = True
    predictor.model.backend.model.half()
    fed: list[torch.dtype] = []
    real_inference = predictor.inference
    monkeypatch.setattr(predictor, "inference",
                        lambda im, *a, **k: (fed.append(im.dtype), real_inference(im, *a, **k))[1])
    host = detector.detect_batch([image])[0]
    device = detector.detect_tensors([_chw(image)])[0]
    assert fed == [torch.float16, torch.float16] and len(host) > 0
    _match(host, device, exact=True)


@pytest.mark.parametrize("fault", ["colours swapped", "shifted a row", "raises"])
def test_a_device_letterbox_that_disagrees_is_switched_off_and_the_host_path_finds_the_boxes(
        fault: str, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The device letterbox is held against Ultralytics' own preprocessing on the first frame of each
    size; one that is wrong or raises is switched off for the run with one warning, and every frame
    (that one included) goes through the host path, finding its boxes."""
    import logging

    import stages.detect.yolo as yolo
    from stages.detect.letterbox import letterbox_batch

    def wrong(images, *args, **kwargs):
        if fault == "raises":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        batch = letterbox_batch(images, *args, **kwargs)
        return batch.flip(1) if fault == "colours swapped" else batch.roll(1, dims=2)

    monkeypatch.setattr(yolo, "letterbox_batch", wrong)
    detector = _sharp()
    images = [_bus((480, 640)), _bus((700, 1000))]
    with caplog.at_level(logging.WARNING, "stages"):
        found = [detector.detect_tensors([_chw(image)])[0] for image in images]
    host = [detector.detect_batch([image])[0] for image in images]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "random" not in
                  r.getMessage()]  # (the test detector's random weights are said at its making)
    assert warning.startswith("detector: fast path letterbox on the device switched off for this run: ")
    assert ("raised RuntimeError: CUDA error" if fault == "raises" else "grey levels (tolerance 1.5)") in warning
    assert sum(len(h) for h in host) > 0
    for got, want in zip(found, host):
        _match(want, got, exact=True)


def test_a_device_letterbox_that_agrees_is_checked_once_per_frame_size(monkeypatch: pytest.MonkeyPatch) -> None:
    sharp_detector = _sharp()
    checked: list[tuple[int, ...]] = []
    real = PersonDetector._letterbox_disagrees
    monkeypatch.setattr(PersonDetector, "_letterbox_disagrees",
                        lambda self, image: checked.append(tuple(image.shape)) or real(self, image))
    for hw in [(333, 500), (333, 500), (300, 640), (333, 500)]:
        sharp_detector.detect_tensors([_chw(_bus(hw))])
    assert checked == [(3, 333, 500), (3, 300, 640)] and not sharp_detector._letterbox_off


def test_device_input_is_checked(sharp_detector: PersonDetector) -> None:
    with pytest.raises(ValueError, match=r"\(3, H, W\) uint8"):
        sharp_detector.detect_tensors([torch.zeros(32, 32, 3, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="is on meta"):
        sharp_detector.detect_tensors([torch.zeros(3, 32, 32, dtype=torch.uint8, device="meta")])


def test_each_frame_becomes_a_tensor_once_per_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The engine uploads each frame, and the YOLO detector reads that upload: no host letterbox, no
    second conversion of a picture to a tensor (on a GPU each is a copy over the bus). The detector's
    stream waits for the upload."""
    from pipeline.run.build import Stages
    from pipeline.run.engine import FrameEngine
    from stages.sapiens2 import load_model
    from stages.sapiens2.estimators import estimator_for
    from stages.sapiens2.tiny import make_tiny

    detector = PersonDetector("yolo11n.yaml", conf=0.01, max_persons=3, imgsz=320, device="cpu")
    seg = estimator_for("seg")(load_model(make_tiny(tmp_path, "seg", image_size=(64, 48)), device="cpu"))
    engine = FrameEngine(Stages(torch.device("cpu"), detector, {"seg": seg}))
    rng = np.random.default_rng(0)
    frames = [Frame(0, rng.integers(0, 256, (120, 160, 3), dtype=np.uint8), 0, None, time.time_ns(), sid)
              for sid in ("a", "b")]
    engine.finish_batch(engine.submit_batch(frames), False)  # first step: Ultralytics' predictor is set up
    pictures: list[tuple[int, ...]] = []
    for name in ("from_numpy", "as_tensor", "tensor"):
        real = getattr(torch, name)

        def spy(data, *args, real=real, **kwargs):
            if isinstance(data, np.ndarray) and data.ndim == 3 and data.size >= 3 * 32 * 32:
                pictures.append(data.shape)
            return real(data, *args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    letterboxed = []
    real_letterbox = LetterBox.__call__
    monkeypatch.setattr(LetterBox, "__call__", lambda self, *a, **k: (letterboxed.append(1),
                                                                     real_letterbox(self, *a, **k))[1])
    waits = []
    real_after = engine.streams.after
    monkeypatch.setattr(engine.streams, "after", lambda event, lane, *t: (waits.append((lane, len(t))),
                                                                        real_after(event, lane, *t)))
    engine.finish_batch(engine.submit_batch(frames), False)
    assert pictures == [(120, 160, 3)] * 2, f"pictures turned into tensors: {pictures}"  # one per frame
    assert letterboxed == []
    assert ("detect", 2) in waits
