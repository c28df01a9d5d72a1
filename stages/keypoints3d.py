"""Whole-body 3D keypoints from one camera: the 2D keypoints lifted into Sapiens2's pointmap.

``lift`` samples the (H, W, 3) pointmap (post-processed as the reference does, at frame size) at each
2D keypoint, on the device and batched over persons and keypoints (no host sync): ``window=1``
bilinear at the sub-pixel position (pixel centres at integer coordinates), ``window=k`` (odd) the
per-axis median of the valid pixels of the k x k neighbourhood; with a segmentation or matte only the
person's pixels are mixed. A point is valid when its score reaches the threshold, the sample is finite
and it lies on the person (``on_person``); invalid points are zeros with valid=False (nothing
non-finite leaves). The root is the mean of the valid hips; ``relative`` gives root-relative
coordinates. Units and axes are the model's (metric only with its scale output): docs/WIRE.md,
"3D keypoints".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Lift:
    """How keypoints are lifted: sampling window (1: bilinear), score threshold, mask rule."""

    window: int = 1
    threshold: float = 0.3
    hips: tuple[int, int] = (9, 10)  # Sapiens2's left_hip, right_hip (stages.metadata names them)

    def __post_init__(self) -> None:
        if self.window < 1 or self.window % 2 == 0:
            raise ValueError(f"window must be an odd number >= 1, got {self.window}")


def sample_bilinear(points: Tensor, xy: Tensor, seg: Tensor | None = None, alpha: Tensor | None = None,
                    background: int = 0) -> Tensor:
    """points (H, W, C) at xy (P, K, 2) pixel coordinates -> (P, K, C) float32, bilinear, clamped to the map.

    Reads only the four pixels around each keypoint (no pass over the whole map); a pixel whose
    weight is zero does not count, so a keypoint on a whole pixel gets exactly that pixel's value.
    With a segmentation or matte, only the pixels on the person count (their weights renormalised):
    a keypoint on the person's outline never mixes in the depth behind them; NaN where none does.
    """
    h, w, _ = points.shape
    x = xy[..., 0].float().clamp(0, w - 1)
    y = xy[..., 1].float().clamp(0, h - 1)
    x0, y0 = x.floor().long(), y.floor().long()
    x1, y1 = (x0 + 1).clamp(max=w - 1), (y0 + 1).clamp(max=h - 1)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]  # (P, K, 1)
    out = torch.zeros((*xy.shape[:-1], points.shape[-1]), dtype=torch.float32, device=points.device)
    total = torch.zeros_like(fx)
    for ys, xs, weight in ((y0, x0, (1 - fx) * (1 - fy)), (y0, x1, fx * (1 - fy)), (y1, x0, (1 - fx) * fy),
                           (y1, x1, fx * fy)):
        person = _on_person_at(ys, xs, seg, alpha, background)
        if person is not None:
            weight = torch.where(person[..., None], weight, 0.0)
            total = total + weight
        out = out + torch.where(weight > 0, weight * points[ys, xs].float(), 0.0)
    if seg is None and alpha is None:
        return out
    return torch.where(total > 0, out / total.clamp(min=1e-12), float("nan"))


def _on_person_at(ys: Tensor, xs: Tensor, seg: Tensor | None, alpha: Tensor | None, background: int) -> Tensor | None:
    """Whether the pixels (ys, xs) are on a person: segmentation class not background, else matte
    alpha >= 0.5; None when neither map runs."""
    if seg is not None:
        return seg[ys, xs] != background
    if alpha is not None:
        return alpha[ys, xs] >= 0.5
    return None


def _nearest(xy: Tensor, h: int, w: int) -> tuple[Tensor, Tensor]:
    return xy[..., 1].round().long().clamp(0, h - 1), xy[..., 0].round().long().clamp(0, w - 1)


def sample_median(points: Tensor, xy: Tensor, window: int, seg: Tensor | None = None, alpha: Tensor | None = None,
                  background: int = 0) -> Tensor:
    """Per-axis median of the usable pixels (finite, and on the person when seg or alpha is given)
    in a window x window neighbourhood of each keypoint's nearest pixel -> (P, K, C); NaN where
    none is usable. The lower of the two middle values when the count is even (torch's median)."""
    h, w, _ = points.shape
    r = window // 2
    offsets = torch.arange(-r, r + 1, device=points.device)
    cy, cx = _nearest(xy, h, w)  # (P, K)
    ys = (cy[..., None, None] + offsets[:, None]).clamp(0, h - 1).expand(*cy.shape, window, window)
    xs = (cx[..., None, None] + offsets[None, :]).clamp(0, w - 1).expand(*cx.shape, window, window)
    patch = points[ys, xs].float()  # (P, K, k, k, C)
    ok = torch.isfinite(patch).all(dim=-1)  # (P, K, k, k)
    person = _on_person_at(ys, xs, seg, alpha, background)
    if person is not None:
        ok = ok & person
    patch = torch.where(ok[..., None], patch, torch.full_like(patch, float("nan")))
    return patch.flatten(2, 3).nanmedian(dim=2).values  # (P, K, C)


def on_person(xy: Tensor, seg: Tensor | None, alpha: Tensor | None, background: int = 0) -> Tensor | None:
    """(P, K) bool: the keypoint's nearest pixel is on a person (segmentation class not background,
    or matte alpha >= 0.5); None when neither map runs."""
    mask = seg if seg is not None else alpha
    if mask is None:
        return None
    ys, xs = _nearest(xy, *mask.shape[:2])
    return _on_person_at(ys, xs, seg, alpha, background)


def lift(points: Tensor, xy: Tensor, scores: Tensor, lift: Lift = Lift(), seg: Tensor | None = None,
         alpha: Tensor | None = None, background: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Keypoints (P, K, 2) of one frame into its pointmap (H, W, 3).

    Returns xyz (P, K, 3) float32 (zeros where invalid), valid (P, K) bool, root (P, 3) float32
    (zeros where invalid) and root_valid (P,) bool; all on the device, no host sync. Work grows
    with the keypoints (and the window), not with the frame: nothing passes over the whole map.
    """
    if lift.window == 1:
        xyz = sample_bilinear(points, xy, seg, alpha, background)
    else:
        xyz = sample_median(points, xy, lift.window, seg, alpha, background)
    valid = (scores >= lift.threshold) & torch.isfinite(xyz).all(dim=-1)  # (P, K)
    person = on_person(xy, seg, alpha, background)
    if person is not None:
        valid = valid & person
    xyz = torch.where(valid[..., None], xyz, torch.zeros_like(xyz)).float()
    a, b = lift.hips  # integer indexing: no index tensor made from host data
    hips = torch.stack((valid[:, a], valid[:, b]), dim=1)  # (P, 2)
    hip_points = torch.stack((xyz[:, a], xyz[:, b]), dim=1)  # (P, 2, 3)
    count = hips.sum(dim=1, keepdim=True)  # (P, 1)
    root_valid = count[:, 0] > 0
    root = (hip_points * hips[..., None]).sum(dim=1) / count.clamp(min=1)  # (P, 3)
    return xyz, valid, root.float(), root_valid


def relative(xyz: Tensor, valid: Tensor, root: Tensor, root_valid: Tensor) -> tuple[Tensor, Tensor]:
    """Root-relative coordinates (P, K, 3) and their validity (a point and its person's root valid)."""
    ok = valid & root_valid[:, None]
    rel = torch.where(ok[..., None], xyz - root[:, None, :], torch.zeros_like(xyz))
    return rel, ok


def smooth3d(smoother, xyz: np.ndarray, valid: np.ndarray, track_ids: np.ndarray, t: float,
             hips: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One frame's 3D points (host) through a per-track smoother (stages.smoothing): a point that is not
    valid holds its track's last value without being published; a smoothed value that is not finite
    makes the point invalid. Returns xyz, valid, root and root_valid as ``lift`` does."""
    smoothed = smoother(np.where(valid[..., None], xyz, np.nan), track_ids, t)
    valid = valid & np.isfinite(smoothed).all(axis=-1)
    xyz = np.where(valid[..., None], smoothed, 0.0).astype(np.float32)
    hips = list(hips)
    count = valid[:, hips].sum(axis=1)
    root_valid = count > 0
    root = np.where(root_valid[:, None], (xyz[:, hips] * valid[:, hips, None]).sum(axis=1)
                    / np.maximum(count, 1)[:, None], 0.0).astype(np.float32)
    return xyz, valid, root, root_valid
