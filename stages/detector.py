"""Person detectors: Ultralytics YOLO (person class only) and a full-frame stand-in.

Both share one interface: ``detect(image_rgb) -> Detections``, ``carry(boxes)``, ``reset()`` and a
``random_weights`` attribute that annotators and publishers use to label meaningless output.

Running the detector every N frames (``every_n``): on the frames in between, the detector returns
the boxes the caller handed it with ``carry()`` (typically ``boxes_from_keypoints`` of the pose
result of the previous frame, so boxes follow the people), keeping the track ids and scores of the
last real detection. Without carried boxes (or when their count changed) the detector simply runs.

Offline behaviour: ``.yaml`` models are built with random weights and need no files. A ``.pt``
name that is not on this machine raises ``DetectorError`` before Ultralytics is asked to download it
when ``YOLO_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``; otherwise Ultralytics may download it once, and any
failure becomes the same one-line ``DetectorError``. Ultralytics' pip auto-install and usage
analytics are switched off in-process (its settings file is not touched).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np

from stages.types import Detections

log = logging.getLogger(__name__)

_OFFLINE_ENV = ("YOLO_OFFLINE", "HF_HUB_OFFLINE")
PERSON_CLASS = 0


class DetectorError(RuntimeError):
    """The detector cannot be built or run; the message says what to do."""


class Detector(Protocol):
    """What the pipeline needs from a person detector."""

    random_weights: bool

    def detect(self, image_rgb: np.ndarray) -> Detections: ...

    def carry(self, boxes: np.ndarray) -> None: ...

    def reset(self) -> None: ...


def is_offline() -> bool:
    """True when the environment asks for no network: ``YOLO_OFFLINE`` or ``HF_HUB_OFFLINE``, both
    read as huggingface_hub reads its own flag (so the two never disagree)."""
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    return any(os.environ.get(name, "").upper() in ENV_VARS_TRUE_VALUES for name in _OFFLINE_ENV)


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", type(image).__name__)
        raise ValueError(f"detector input: expected (H, W, 3) uint8 RGB, got {shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"detector input: expected uint8, got {image.dtype}")


def boxes_from_keypoints(
    xy: np.ndarray,
    scores: np.ndarray,
    threshold: float,
    image_size: tuple[int, int],
    margin: float = 0.1,
) -> np.ndarray:
    """Boxes around each person's confident keypoints, to carry between detector runs.

    xy: (N, K, 2) pixels; scores: (N, K); image_size: (height, width) as in ``image.shape[:2]``.
    Each box is the extent of the keypoints with score > threshold, grown by ``margin`` times its
    size on every side and clipped to the image. Returns (N, 4) float32 xyxy; a person with fewer
    than two confident keypoints gets a row of NaN (``carry`` drops such rows).
    """
    xy = np.asarray(xy, dtype=np.float32)
    scores = np.asarray(scores, dtype=np.float32)
    if xy.ndim != 3 or xy.shape[2] != 2 or scores.shape != xy.shape[:2]:
        raise ValueError(
            f"boxes_from_keypoints: expected xy (N, K, 2) and scores (N, K), got {xy.shape} and {scores.shape}"
        )
    height, width = image_size
    visible = scores > threshold  # (N, K)
    big = np.float32(np.inf)
    lo = np.where(visible[..., None], xy, big).min(axis=1)  # (N, 2)
    hi = np.where(visible[..., None], xy, -big).max(axis=1)  # (N, 2)
    pad = (hi - lo) * margin
    boxes = np.concatenate([lo - pad, hi + pad], axis=1)  # (N, 4)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    boxes[visible.sum(axis=1) < 2] = np.nan
    return boxes.astype(np.float32)


class FullFrameDetector:
    """The whole frame is one person (box [0, 0, W, H], score 1, id 0), for close-up cameras."""

    random_weights = False

    def detect(self, image_rgb: np.ndarray) -> Detections:
        _check_image(image_rgb)
        h, w = image_rgb.shape[:2]
        return Detections(np.array([[0, 0, w, h]], np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))

    def carry(self, boxes: np.ndarray) -> None:
        """Ignored: the box is always the full frame."""

    def reset(self) -> None:
        """Nothing to reset."""


def _quiet_ultralytics() -> None:
    """Stop Ultralytics from pip-installing packages or posting analytics from this process."""
    import ultralytics.utils.checks as checks
    import ultralytics.utils.events as events

    checks.AUTOINSTALL = False
    events.events.enabled = False


def _missing_message(model: str, why: str) -> str:
    return (
        f"{model} is not on this machine{why}; pass --detector-model PATH "
        f"to a local .pt, --detector-model yolo11n.yaml for random weights (testing only), or --detector full-frame"
    )


def load_yolo(model: str | Path) -> tuple[Any, bool]:
    """Build an Ultralytics YOLO; returns (model, random_weights). Raises DetectorError."""
    try:
        from ultralytics import YOLO
        from ultralytics.utils import SETTINGS
    except ImportError as exc:
        raise DetectorError(f"ultralytics is not installed ({exc}); install it or use --detector full-frame") from exc
    _quiet_ultralytics()
    name = str(model)
    path = Path(name)
    if path.suffix.lower() in {".yaml", ".yml"}:
        try:
            yolo = YOLO(name)  # architecture from the yaml, random init: no files needed
        except (FileNotFoundError, KeyError, ValueError, TypeError) as exc:
            raise DetectorError(f"cannot build a detector from {name}: {exc}") from exc
        log.warning("detector %s has random weights: it finds few or no people (testing only)", name)
        return yolo, True
    if not path.exists():
        cached = Path(SETTINGS["weights_dir"]) / path.name
        if cached.exists():
            path = cached
        elif is_offline() or path.parent != Path("."):
            # A name with a folder is a local path: nothing to download. Offline: do not try.
            why = " and cannot be downloaded (offline)" if is_offline() else " (no such file)"
            raise DetectorError(_missing_message(name, why))
    try:
        yolo = YOLO(str(path))
    except (OSError, RuntimeError, ValueError, KeyError, AttributeError) as exc:
        if not Path(str(path)).exists() and not Path(SETTINGS["weights_dir"], path.name).exists():
            log.debug("download of %s failed", name, exc_info=True)
            why = f" and the download failed ({type(exc).__name__}; offline?)"
            raise DetectorError(_missing_message(name, why)) from exc
        raise DetectorError(f"cannot load detector weights {path}: {exc}") from exc
    return yolo, False


def _cuda_device(device: str | int | None) -> bool:
    if device is None:
        import torch

        return torch.cuda.is_available()
    text = str(device).lower()
    return text.isdigit() or text.startswith("cuda")


class PersonDetector:
    """Ultralytics YOLO restricted to people, returning ``Detections``.

    model: ``.pt`` path or name, or ``.yaml`` for random weights (offline tests). conf / iou: NMS
    thresholds; max_persons: most boxes kept (highest scores); imgsz: inference size; half: fp16,
    used on CUDA only; device: passed to Ultralytics (None = its default); track: ByteTrack ids;
    every_n: run the detector on every N-th frame and use ``carry()`` boxes in between.
    """

    def __init__(
        self,
        model: str | Path = "yolo11n.pt",
        conf: float = 0.25,
        iou: float = 0.7,
        max_persons: int = 16,
        imgsz: int = 640,
        half: bool = True,
        device: str | int | None = None,
        track: bool = False,
        every_n: int = 1,
    ) -> None:
        if every_n < 1:
            raise ValueError(f"every_n must be >= 1, got {every_n}")
        if max_persons < 1:
            raise ValueError(f"max_persons must be >= 1, got {max_persons}")
        self.model, self.random_weights = load_yolo(model)
        self.conf, self.iou, self.max_persons, self.imgsz = conf, iou, max_persons, imgsz
        self.device = device
        self.half = bool(half and _cuda_device(device))
        self.track, self.every_n = track, every_n
        self._frame = 0
        self._carried: np.ndarray | None = None
        self._last = Detections.empty()

    def reset(self) -> None:
        """Forget tracks and carried boxes (call on a new stream or after a seek)."""
        self._frame, self._carried, self._last = 0, None, Detections.empty()
        predictor = getattr(self.model, "predictor", None)
        if predictor is not None and hasattr(predictor, "trackers"):
            for tracker in predictor.trackers:
                tracker.reset()

    def carry(self, boxes: np.ndarray) -> None:
        """Boxes (N, 4) xyxy for the next frames the detector skips, in the order of the last
        detections (so their track ids and scores carry over). NaN rows are dropped."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        self._carried = boxes

    def _carried_detections(self) -> Detections | None:
        boxes = self._carried
        if boxes is None or len(boxes) != len(self._last) or len(boxes) == 0:
            return None
        keep = np.isfinite(boxes).all(axis=1) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        return Detections(boxes[keep], self._last.scores[keep], self._last.track_ids[keep])

    def detect(self, image_rgb: np.ndarray) -> Detections:
        """Find people in one (H, W, 3) uint8 RGB frame."""
        _check_image(image_rgb)
        frame, self._frame = self._frame, self._frame + 1
        if frame % self.every_n != 0:
            carried = self._carried_detections()
            if carried is not None:
                self._last = carried
                return carried
        self._carried = None
        self._last = self._run(image_rgb)
        return self._last

    def _run(self, image_rgb: np.ndarray) -> Detections:
        bgr = cv2.cvtColor(image_rgb, cv2.COLOR_RGB2BGR)  # Ultralytics reads numpy input as BGR
        kwargs: dict[str, Any] = dict(
            conf=self.conf,
            iou=self.iou,
            classes=[PERSON_CLASS],
            max_det=self.max_persons,
            imgsz=self.imgsz,
            half=self.half,
            verbose=False,
        )
        if self.device is not None:
            kwargs["device"] = self.device
        try:
            with _no_device_sync():
                if self.track:
                    results = self.model.track(bgr, persist=True, tracker="bytetrack.yaml", **kwargs)
                else:
                    results = self.model.predict(bgr, **kwargs)
        except (RuntimeError, ValueError, OSError) as exc:
            raise DetectorError(f"person detector failed: {exc}") from exc
        boxes = results[0].boxes
        xyxy = boxes.xyxy.cpu().numpy().astype(np.float32)  # (N, 4)
        scores = boxes.conf.cpu().numpy().astype(np.float32)  # (N,)
        if boxes.id is not None:
            ids = boxes.id.cpu().numpy().astype(np.int64)
        else:
            ids = np.full(len(xyxy), -1, np.int64)
        order = np.argsort(-scores, kind="stable")[: self.max_persons]
        return Detections(xyxy[order], scores[order], ids[order])


@contextlib.contextmanager
def _no_device_sync() -> Iterator[None]:
    """Ultralytics times each predict step with a device-wide ``synchronize()`` (6 per frame), which
    would make the detector wait for the Sapiens2 work queued on the other CUDA streams and undo their
    overlap. Inside detect() its timer reads the clock without synchronising; the results' ``.cpu()``
    still waits for the detector's own stream."""
    from ultralytics.utils import ops

    original = ops.Profile.time
    ops.Profile.time = lambda self: time.perf_counter()
    try:
        yield
    finally:
        ops.Profile.time = original
