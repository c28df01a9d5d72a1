"""Ultralytics' letterbox in torch, for the YOLO detector's frames already on the device.

The same geometry as ``ultralytics.data.augment.LetterBox`` (scale, rounding of the resized size, the
split of the padding, grey 114 borders), so ``ultralytics.utils.ops.scale_boxes`` maps boxes back as
it does for the host path. OpenCV's bilinear resize works in fixed point, this one in float rounded
to whole grey levels: a resized pixel may differ by one level (never more); integer scale factors,
and frames that need no resize, are identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

PAD_VALUE = 114  # Ultralytics' grey border


@dataclass(frozen=True)
class LetterboxGeometry:
    """Where a frame lands in the letterboxed input (all host ints: no device reads)."""

    resized_hw: tuple[int, int]  # (h, w) of the frame after the resize
    top: int
    bottom: int
    left: int
    right: int

    @property
    def out_hw(self) -> tuple[int, int]:
        return self.resized_hw[0] + self.top + self.bottom, self.resized_hw[1] + self.left + self.right


def letterbox_geometry(frame_hw: tuple[int, int], new_shape: int | tuple[int, int], auto: bool,
                       stride: int = 32, scaleup: bool = True) -> LetterboxGeometry:
    """LetterBox.get_params (centred, not scale_fill) for a frame of (h, w)."""
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    h, w = frame_hw
    r = min(new_shape[0] / h, new_shape[1] / w)
    if not scaleup:
        r = min(r, 1.0)
    new_w, new_h = max(round(w * r), 1), max(round(h * r), 1)
    dw, dh = new_shape[1] - new_w, new_shape[0] - new_h
    if auto:  # the smallest rectangle that is a multiple of the stride
        dw, dh = dw % stride, dh % stride
    dw, dh = dw / 2, dh / 2
    return LetterboxGeometry((new_h, new_w), round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1))


def letterbox(image: Tensor, geometry: LetterboxGeometry) -> Tensor:
    """(3, H, W) uint8 RGB on the device -> (3, h, w) float32 in 0..255 (whole grey levels), letterboxed."""
    pixels = image.unsqueeze(0).float()  # (1, 3, H, W)
    if tuple(image.shape[1:]) != geometry.resized_hw:
        # OpenCV's INTER_LINEAR: half-pixel centres, no antialiasing; its result is uint8, so round
        # half up as its fixed-point arithmetic does.
        pixels = F.interpolate(pixels, size=geometry.resized_hw, mode="bilinear", align_corners=False,
                               antialias=False).add_(0.5).floor_().clamp_(0.0, 255.0)  # (1, 3, h', w')
    g = geometry
    return F.pad(pixels, (g.left, g.right, g.top, g.bottom), value=float(PAD_VALUE))[0]  # (3, h, w)


def letterbox_batch(images: list[Tensor], new_shape: int | tuple[int, int], auto: bool, stride: int = 32,
                    half: bool = False) -> Tensor:
    """Frames (3, H_i, W_i) uint8 on the device -> the detector's input (B, 3, h, w) in 0..1, RGB.

    ``auto`` as Ultralytics' predictor decides it (frames of one size and a rectangular model): the
    smallest stride-multiple rectangle; otherwise every frame is padded to ``new_shape``.
    """
    boxes = [letterbox(image, letterbox_geometry(tuple(image.shape[1:]), new_shape, auto, stride))
             for image in images]
    batch = torch.stack(boxes)  # (B, 3, h, w), 0..255
    batch = batch.half() if half else batch
    return batch.div_(255.0)


__all__ = ["PAD_VALUE", "LetterboxGeometry", "letterbox", "letterbox_batch", "letterbox_geometry"]
