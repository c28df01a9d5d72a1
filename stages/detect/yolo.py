"""The YOLO person detector: Ultralytics' YOLO restricted to the person class, ``Detections`` by score.

``detect`` / ``detect_batch`` take host frames; ``detect_tensors`` takes frames already on the
detector's device (the engine's upload): letterbox there (stages.detect.letterbox), then the
predictor's own model and NMS on the tensor (``predict_on_device``), one copy of the boxes to the host.
That letterbox is a fast path of ours: on the first frame of each size it is held against Ultralytics'
own preprocessing, and one that disagrees or raises is switched off for the run (one warning; the
frames then go through the host path). Every Ultralytics failure becomes a one-line ``DetectorError``;
the process's CPU thread count stays.

Ultralytics times each predict step with a device-wide ``synchronize()``, which would make the
detector wait for the Sapiens2 work queued on the other CUDA streams. No supported hook reaches those
timers: their clock is wrapped once, and skips the synchronisation only on a thread inside our predict.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from stages.device import resolve_device
from stages.sapiens2.verify import raised, switched_off
from stages.types import Detections

from . import DetectorError, check_input
from .checkpoint import load_yolo
from .letterbox import letterbox_batch

log = logging.getLogger(__name__)

PERSON_CLASS = 0
LETTERBOX_LEVELS = 1.5  # one grey level (stages.detect.letterbox), plus float16's rounding near 1.0


class PersonDetector:
    """Ultralytics YOLO restricted to people, returning ``Detections`` sorted by score.

    model: ``.pt`` path or name, or ``.yaml`` for random weights (offline tests). conf / iou: NMS
    thresholds; max_persons: most boxes kept (highest scores); imgsz: inference size; half: fp16,
    used on CUDA only; device: where the model runs (a torch device or its name); trust: allow
    unpickling a ``.pt`` that is not an official release name.
    """

    kind = "yolo"
    persons_per_frame = None  # up to max_persons

    def __init__(
        self,
        model: str | Path = "yolo11n.pt",
        conf: float = 0.25,
        iou: float = 0.7,
        max_persons: int = 16,
        imgsz: int = 640,
        half: bool = True,
        device: str | torch.device | None = None,
        trust: bool = False,
    ) -> None:
        if max_persons < 1:
            raise ValueError(f"max_persons must be >= 1, got {max_persons}")
        if not (0.0 <= conf <= 1.0 and 0.0 <= iou <= 1.0):
            raise ValueError(f"conf and iou must be within 0..1, got {conf} and {iou}")
        self.model, self.random_weights = load_yolo(model, trust)
        self.conf, self.iou, self.max_persons, self.imgsz = conf, iou, max_persons, imgsz
        self.device = resolve_device(device)
        self.half = bool(half and self.device.type == "cuda")
        self._checked_device = False
        self._letterbox_checked: set[tuple[int, ...]] = set()  # frame shapes whose device letterbox agreed
        self._letterbox_off = False  # it disagreed or raised: frames take the host path

    def detect(self, image_rgb: np.ndarray) -> Detections:
        """Find people in one (H, W, 3) uint8 RGB frame."""
        return self.detect_batch([image_rgb])[0]

    def detect_batch(self, images_rgb: Sequence[np.ndarray]) -> list[Detections]:
        """Find people in several frames with one forward; one Detections per frame, in order."""
        for image in images_rgb:
            check_input(image)
        if not images_rgb:
            return []
        bgr = [cv2.cvtColor(image, cv2.COLOR_RGB2BGR) for image in images_rgb]  # Ultralytics reads numpy as BGR
        results = self._guarded(lambda: self.model.predict(bgr if len(bgr) > 1 else bgr[0], **self._kwargs()))
        self._check_device()
        return [self._detections(r.boxes.xyxy.cpu().numpy(), r.boxes.conf.cpu().numpy()) for r in results]

    def detect_tensors(self, images: Sequence[Tensor]) -> list[Detections]:
        """Find people in frames already on the detector's device, (3, H, W) uint8 RGB tensors: letterbox,
        normalisation, forward and NMS on the device (the frame is not uploaded again), one copy of all
        frames' boxes to the host. The same boxes as ``detect_batch`` (see stages.detect.letterbox)."""
        want = self.device
        for image in images:
            if not isinstance(image, Tensor) or image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
                shape = getattr(image, "shape", image)
                raise ValueError(f"detector input: expected a (3, H, W) uint8 tensor, got {shape}")
            if image.device != want:
                raise ValueError(f"detector input is on {image.device}, the detector on {want}")
        if not images:
            return []
        if getattr(self.model, "predictor", None) is None:  # Ultralytics sets its predictor up on a first predict
            h, w = images[0].shape[1:]
            self._guarded(lambda: self.model.predict(np.zeros((h, w, 3), np.uint8), **self._kwargs()))
            self._check_device()
        running = self.inference_device()
        # On another device the frames would meet the model there; a letterbox that failed its check is off.
        if (running is not None and running != want) or not self._letterbox_agrees(images):
            return self.detect_batch([image.permute(1, 2, 0).cpu().numpy() for image in images])
        with torch.inference_mode():
            found = self._guarded(lambda: predict_on_device(self.model.predictor, list(images)))
        host = torch.cat([d[:, :5] for d in found]).float().cpu().numpy()  # (sum n_i, 5): the one download
        out, start = [], 0
        for det in found:
            rows = host[start:start + len(det)]
            start += len(det)
            out.append(self._detections(rows[:, :4], rows[:, 4]))
        return out

    def _letterbox_agrees(self, images: Sequence[Tensor]) -> bool:
        """The device letterbox against Ultralytics' preprocessing, once per frame size; False (for the
        rest of the run, said once) when it disagreed or raised."""
        for image in images:
            if self._letterbox_off or tuple(image.shape) in self._letterbox_checked:
                continue
            reason = self._letterbox_disagrees(image)
            if reason is not None:
                switched_off("detector", "letterbox on the device", f"{reason}; frames go through the host")
                self._letterbox_off = True
            self._letterbox_checked.add(tuple(image.shape))
        return not self._letterbox_off

    def _letterbox_disagrees(self, image: Tensor) -> str | None:
        """Why the device letterbox of ``image`` (3, H, W) is not Ultralytics' own input, or None: the
        same shape, and at most one grey level apart (OpenCV's fixed-point resize rounds differently)."""
        predictor = self.model.predictor
        try:
            with torch.inference_mode():
                ours = letterbox_batch([image], tuple(predictor.imgsz), rect_letterbox(predictor, [image]),
                                       int(predictor.model.stride), half=bool(predictor.model.fp16))  # (1, 3, h, w)
                host = cv2.cvtColor(image.permute(1, 2, 0).cpu().numpy(), cv2.COLOR_RGB2BGR)
                theirs = predictor.preprocess([host]).to(ours.device)  # (1, 3, h, w)
        except Exception as exc:  # any failure of a fast path turns it off; the host path goes on
            return f"it raised {raised(exc)}"
        if ours.shape != theirs.shape:
            return f"it made a {tuple(ours.shape)} input where Ultralytics makes {tuple(theirs.shape)}"
        levels = float((ours.float() - theirs.float()).abs().max()) * 255.0
        if levels > LETTERBOX_LEVELS:
            return f"its input differs from Ultralytics' by {levels:.1f} grey levels (tolerance {LETTERBOX_LEVELS:g})"
        return None

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(conf=self.conf, iou=self.iou, classes=[PERSON_CLASS], max_det=self.max_persons,
                                      imgsz=self.imgsz, verbose=False, device=self.device)
        if self.half:
            kwargs["quantize"] = 16
        return kwargs

    def _guarded(self, call: Any) -> Any:
        """Run an Ultralytics call: its errors become DetectorError, the process's thread count stays."""
        threads = torch.get_num_threads()
        try:
            with _no_device_sync():
                return call()
        except (RuntimeError, ValueError, OSError) as exc:
            raise DetectorError(f"person detector failed: {exc}") from exc
        finally:
            torch.set_num_threads(threads)  # Ultralytics resets the process's CPU thread count on every call

    def inference_device(self) -> torch.device | None:
        """Where Ultralytics runs the detector: its predictor's module (``setup_model`` deep-copies the
        YOLO into an AutoBackend on the device; the wrapper's own ``model.model`` stays where it was
        built, on the CPU). None before the first predict."""
        backend = getattr(getattr(self.model, "predictor", None), "model", None)  # an AutoBackend
        for module in (backend, getattr(getattr(backend, "backend", None), "model", None)):  # (8.4: backend.model)
            param = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
            if param is not None:
                return param.device
        device = getattr(backend, "device", None)
        return None if device is None else torch.device(device)

    def _check_device(self) -> None:
        """Said once: a detector that runs elsewhere than asked still works (frames on the device go to
        it through the host), so it is a warning, never an error."""
        if self._checked_device:
            return
        self._checked_device = True
        running = self.inference_device()
        if running is not None and running != self.device:
            log.warning("the detector runs on %s, not on the requested %s (Ultralytics' choice): frames reach it "
                        "through the host; pass --device with an index (cuda:N) to keep them on one device",
                        running, self.device)

    def _detections(self, xyxy: np.ndarray, scores: np.ndarray) -> Detections:
        xyxy, scores = xyxy.astype(np.float32), scores.astype(np.float32)  # (N, 4), (N,)
        order = np.argsort(-scores, kind="stable")[: self.max_persons]
        return Detections(xyxy[order], scores[order], np.full(len(order), -1, np.int64))


def rect_letterbox(predictor: Any, images: list[Tensor]) -> bool:
    """Whether Ultralytics' pre_transform would letterbox these frames to the smallest rectangle."""
    model = predictor.model
    same_shapes = len({tuple(image.shape) for image in images}) == 1
    return bool(same_shapes and predictor.args.rect and not getattr(predictor, "scale_fill", False)
                and (model.format == "pt" or (getattr(model, "dynamic", False) and model.format != "imx")))


def predict_on_device(predictor: Any, images: list[Tensor]) -> list[Tensor]:
    """Frames (3, H_i, W_i) uint8 RGB on the device -> per frame (n_i, 6) x1 y1 x2 y2 score class in
    frame pixels, on the device (one forward, one NMS, as Ultralytics' predictor does them; its own tensor
    path reads the input's range on the host and copies the letterboxed batch back to build Results).

    ``predictor``: an Ultralytics predictor already set up (model, args, imgsz). NMS reads how many
    boxes it kept on the host (boolean indexing): the detector is a host loop on its own stream.
    """
    from ultralytics.utils import nms, ops

    model, args = predictor.model, predictor.args
    pixels = letterbox_batch(images, tuple(predictor.imgsz), rect_letterbox(predictor, images), int(model.stride),
                             half=bool(model.fp16))  # (B, 3, h, w)
    preds = predictor.inference(pixels)
    kept = nms.non_max_suppression(preds, args.conf, args.iou, args.classes, args.agnostic_nms, max_det=args.max_det,
                                   nc=0, end2end=getattr(model, "end2end", False), rotated=False)
    out = []
    for det, image in zip(kept, images):
        det = det.clone()
        det[:, :4] = ops.scale_boxes(tuple(pixels.shape[2:]), det[:, :4], tuple(image.shape[1:]))  # (n, 4)
        out.append(det)
    return out


_local = threading.local()
_installed = False


def _install_sync_free_clock() -> None:
    """Wrap Ultralytics' timer clock once: no synchronisation on a thread inside ``_no_device_sync``."""
    global _installed
    if _installed:
        return
    from ultralytics.utils import ops

    original = ops.Profile.time

    def time_without_sync_here(self: Any) -> float:
        if getattr(_local, "no_sync", False):
            return time.perf_counter()
        return original(self)

    ops.Profile.time = time_without_sync_here
    _installed = True


@contextlib.contextmanager
def _no_device_sync() -> Iterator[None]:
    """Inside, Ultralytics' step timers on this thread read the clock without synchronising the
    device; the results' ``.cpu()`` still waits for the detector's own stream."""
    _install_sync_free_clock()
    before = getattr(_local, "no_sync", False)
    _local.no_sync = True
    try:
        yield
    finally:
        _local.no_sync = before
