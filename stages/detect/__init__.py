"""Person detection and tracking: the interface every detector keeps, and the full-frame detector.

A detector takes (H, W, 3) uint8 RGB frames and returns one ``Detections`` per frame:
``detect(image)``, or ``detect_batch(images)`` for the frames of several sources in one forward.
``random_weights`` says its output is meaningless (annotators and publishers label it).
The YOLO detector is ``stages.detect.yolo``, its checkpoints ``stages.detect.checkpoint``, ids and
boxes between detector runs ``stages.detect.tracking``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from stages.types import Detections


class DetectorError(RuntimeError):
    """The detector cannot be built or run; the message says what to do."""


class Detector(Protocol):
    """What the pipeline needs from a person detector (``kind``: how it finds persons, said in the
    published status: ``yolo`` or ``full-frame``; ``persons_per_frame``: how many it finds in every
    frame when that is known, else None: pose warms up and compiles only the batches it will see)."""

    random_weights: bool
    kind: str
    persons_per_frame: int | None

    def detect(self, image_rgb: np.ndarray) -> Detections: ...

    def detect_batch(self, images_rgb: Sequence[np.ndarray]) -> list[Detections]: ...


def check_input(image: np.ndarray) -> None:
    """ValueError unless ``image`` is what a detector takes: (H, W, 3) uint8 RGB."""
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", type(image).__name__)
        raise ValueError(f"detector input: expected (H, W, 3) uint8 RGB, got {shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"detector input: expected uint8, got {image.dtype}")


class FullFrameDetector:
    """The whole frame is one person (box [0, 0, W, H], score 1, id 0), for close-up cameras."""

    random_weights = False
    kind = "full-frame"
    persons_per_frame = 1

    def detect(self, image_rgb: np.ndarray) -> Detections:
        check_input(image_rgb)
        h, w = image_rgb.shape[:2]
        return Detections(np.array([[0, 0, w, h]], np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))

    def detect_batch(self, images_rgb: Sequence[np.ndarray]) -> list[Detections]:
        return [self.detect(image) for image in images_rgb]
