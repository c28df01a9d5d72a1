"""Batched output decoding on the model's device: keypoints, class maps, mattes, normals, pointmaps.

Pure torch; reproduces the reference post-processing (transformers 5.23 ``Sapiens2ImageProcessor``).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .preprocess import crop_params, device_constant, pad_box


@functools.lru_cache(maxsize=8)
def _blur_kernel(kernel: int, device: torch.device) -> Tensor:
    """(kernel, kernel) Gaussian weights with cv2's sigma for the size, made exactly as torchvision's
    ``gaussian_blur`` (and so the reference) makes them: a softmax over a linspace, per axis, then the
    outer product, in float32 (tests/stages/sapiens2/test_sapiens2_parity.py holds them against torchvision's)."""
    sigma = 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8
    lim = (kernel - 1) / (2.0 * math.sqrt(2.0))
    axis = torch.softmax(torch.linspace(-lim, lim, steps=kernel, dtype=torch.float32).div(sigma).pow(2).neg(), dim=0)
    return (axis.unsqueeze(-1) * axis).to(device)


def blur_preserve_max(heatmaps: Tensor, kernel: int = 11) -> Tensor:
    """Gaussian blur (cv2's sigma for the kernel size) of (B, K, h, w) heatmaps with zero borders,
    rescaled to keep each map's maximum (as DARK-UDP expects).

    One depthwise convolution over the zero-padded maps: the reference's sums, bit for bit (it
    pads again with reflection inside torchvision and crops that border off afterwards).
    """
    if kernel % 2 == 0 or kernel <= 1:
        raise ValueError("blur kernel must be an odd integer greater than 1")
    b, k, h, w = heatmaps.shape
    border = (kernel - 1) // 2
    padded = F.pad(heatmaps.reshape(1, b * k, h, w), (border,) * 4)  # (1, B*K, h+2r, w+2r)
    weights = _blur_kernel(kernel, heatmaps.device).to(heatmaps.dtype).expand(b * k, 1, kernel, kernel)
    blurred = F.conv2d(padded, weights, groups=b * k).reshape(b, k, h, w)
    orig_max = heatmaps.amax(dim=(2, 3))
    new_max = blurred.amax(dim=(2, 3))
    safe = torch.where(new_max > 0, new_max, torch.ones_like(new_max))
    ratio = torch.where(new_max > 0, orig_max / safe, torch.ones_like(new_max))
    return blurred * ratio[..., None, None]


def argmax_keypoints(heatmaps: Tensor) -> tuple[Tensor, Tensor]:
    """(B, K, h, w) -> integer locations (B, K, 2) x/y (-1 where the max is <= 0) and scores (B, K)."""
    b, k, _, w = heatmaps.shape
    flat = heatmaps.reshape(b, k, -1)
    scores, idx = flat.max(dim=-1)
    xy = torch.stack(((idx % w).float(), (idx // w).float()), dim=-1)
    return torch.where(scores[..., None] > 0, xy, torch.full_like(xy, -1.0)), scores


def dark_udp_refine(xy: Tensor, heatmaps: Tensor, kernel: int = 11, max_offset: float | None = 1.0) -> Tensor:
    """Sub-pixel refinement: one Newton step on the blurred log-heatmap around each argmax.

    A flat or saddle-shaped neighbourhood (det ~ 0) gives a wild step; steps longer than
    max_offset heatmap pixels are dropped (None keeps them, exactly as the reference does).
    """
    b, k, h, w = heatmaps.shape
    valid = (xy >= 0).all(-1, keepdim=True)  # no positive peak -> stays at -1, not refined
    xy_in = torch.where(valid, xy, torch.zeros_like(xy))
    logh = blur_preserve_max(heatmaps, kernel).clamp(1e-3, 50.0).log()
    padded = F.pad(logh, (1, 1, 1, 1), mode="replicate").reshape(b, k, -1)  # (B, K, (h+2)(w+2))
    pw = w + 2
    centre = (xy_in[..., 0].long() + 1) + (xy_in[..., 1].long() + 1) * pw  # (B, K)
    offsets = device_constant((0, 1, -1, pw, -pw, pw + 1, -pw - 1), torch.long, xy.device)
    v = padded.gather(2, centre[..., None] + offsets)  # (B, K, 7)
    c, xp, xm, yp, ym, pp, mm = v.unbind(-1)
    dx = 0.5 * (xp - xm)
    dy = 0.5 * (yp - ym)
    eps = torch.finfo(torch.float32).eps
    dxx = xp - 2 * c + xm + eps
    dyy = yp - 2 * c + ym + eps
    dxy = 0.5 * (pp - xp - yp + c + c - xm - ym + mm)
    det = dxx * dyy - dxy * dxy
    off_x = (dyy * dx - dxy * dy) / det
    off_y = (-dxy * dx + dxx * dy) / det
    offset = torch.stack((off_x, off_y), dim=-1)
    if max_offset is not None:
        sane = torch.isfinite(offset).all(-1, keepdim=True) & (offset.abs() <= max_offset).all(-1, keepdim=True)
        offset = torch.where(sane, offset, torch.zeros_like(offset))
    return torch.where(valid, xy_in - offset, xy)


def flip_back(heatmaps: Tensor, flip_pairs: Tensor) -> Tensor:
    """Heatmaps of mirrored crops -> original orientation: swap left/right channels, mirror x."""
    out = heatmaps.clone()
    left, right = flip_pairs[:, 0], flip_pairs[:, 1]
    out[:, left] = heatmaps[:, right]
    out[:, right] = heatmaps[:, left]
    return out.flip(-1)


def decode_pose(heatmaps: Tensor, boxes_xyxy: Tensor, input_size: tuple[int, int], kernel: int = 11,
                padding: float = 1.25, max_offset: float | None = 1.0) -> tuple[Tensor, Tensor]:
    """Heatmaps (N, K, h, w) of crops from boxes (N, 4) -> keypoints (N, K, 2) image pixels, scores (N, K)."""
    heatmaps = heatmaps.float()
    b, _, h, w = heatmaps.shape
    if b == 0:
        return heatmaps.new_zeros(0, heatmaps.shape[1], 2), heatmaps.new_zeros(0, heatmaps.shape[1])
    xy, scores = argmax_keypoints(heatmaps)
    xy = dark_udp_refine(xy, heatmaps, kernel, max_offset)
    center, size = crop_params(boxes_xyxy.to(heatmaps.device), input_size, padding)
    hm_size = device_constant((w - 1.0, h - 1.0), torch.float32, heatmaps.device)
    xy = xy / hm_size * size[:, None] + center[:, None] - 0.5 * size[:, None]
    return xy, scores


def seg_classes(logits: Tensor, frame_hw: tuple[int, int]) -> Tensor:
    """Logits (B, C, h, w) -> class ids (B, H, W) at frame size (bilinear logits, then argmax).

    The logits are upsampled in channels_last layout so the argmax reads each pixel's classes from
    contiguous memory: 1.8x faster on the CPU at 1080p (an NCHW argmax over C is a strided
    reduction); the interpolated values differ from NCHW's only by float rounding (< 1e-6).
    """
    nhwc = logits.float().contiguous(memory_format=torch.channels_last)
    return F.interpolate(nhwc, size=frame_hw, mode="bilinear", align_corners=False).argmax(dim=1)


def matting_maps(maps: Tensor, frame_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Sigmoid head output (B, 4, h, w) -> alpha (B, H, W) and premultiplied foreground (B, 3, H, W)."""
    up = F.interpolate(maps.float(), size=frame_hw, mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    return up[:, 3], up[:, :3]


def composite(foreground: Tensor, alpha: Tensor, background: Tensor) -> Tensor:
    """Premultiplied foreground (B, 3, H, W) over background (B|1, 3, H, W) in [0, 1] -> uint8."""
    out = (foreground + (1 - alpha[:, None]) * background).clamp(0.0, 1.0)
    return (out * (256.0 - 1e-3)).to(torch.uint8)  # torchvision's float -> uint8 scaling (even bins)


def _unpad_resize(maps: Tensor, frame_hw: tuple[int, int], input_size: tuple[int, int]) -> Tensor:
    top, left, bottom, right = pad_box(frame_hw, input_size)
    maps = maps[:, :, top:bottom, left:right]
    return F.interpolate(maps, size=frame_hw, mode="bilinear", align_corners=False)


def normal_maps(raw: Tensor, frame_hw: tuple[int, int], input_size: tuple[int, int]) -> Tensor:
    """Raw normals (B, 3, h, w) of a padded input -> unit normals (B, 3, H, W) at frame size."""
    unit = F.normalize(raw.float(), p=2, dim=1, eps=1e-8)
    return _unpad_resize(unit, frame_hw, input_size)


def pointmaps(raw: Tensor, scale: Tensor | None, frame_hw: tuple[int, int], input_size: tuple[int, int]) -> Tensor:
    """Raw pointmap (B, 3, h, w) (divided by the predicted scale when present) -> (B, 3, H, W)."""
    points = raw.float()
    if scale is not None:
        points = points / scale.float()[:, :, None, None]
    return _unpad_resize(points, frame_hw, input_size)
