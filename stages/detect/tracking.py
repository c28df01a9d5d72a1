"""Who is who between frames: ByteTrack ids for one source, and boxes carried from keypoints.

Tracking is separate from detection (one ``ByteTracker`` per source), so the frames of several
cameras can share one detector batch. Between detector runs (``detect_every``) the engine carries
each person's box from the keypoints of the frame before (``carry_boxes``, on the device).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from stages.types import Detections


def carry_boxes(xy: Tensor, scores: Tensor, threshold: float, frame_wh: Tensor, previous: Tensor,
                margin: float = 0.1) -> Tensor:
    """Boxes around each person's confident keypoints, for the frames the detector skips.

    xy: (N, K, 2) pixels; scores: (N, K); frame_wh: (N, 2) width and height of each person's frame;
    previous: (N, 4) the boxes the keypoints came from. Each box is the extent of the keypoints with
    score > threshold, grown by ``margin`` times its size on every side and clipped to the frame; a
    person with fewer than two confident keypoints keeps its previous box (the row count never
    changes, so carried boxes stay aligned with their scores and track ids). Pure torch: runs on
    the device without a host sync. Returns (N, 4) float32 xyxy.
    """
    if xy.ndim != 3 or xy.shape[2] != 2 or scores.shape != xy.shape[:2] or previous.shape != (xy.shape[0], 4):
        raise ValueError(f"carry_boxes: expected xy (N, K, 2), scores (N, K), previous (N, 4); got "
                         f"{tuple(xy.shape)}, {tuple(scores.shape)}, {tuple(previous.shape)}")
    xy, previous = xy.float(), previous.float()
    visible = scores > threshold  # (N, K)
    big = torch.finfo(torch.float32).max
    lo = torch.where(visible[..., None], xy, big).amin(dim=1)  # (N, 2)
    hi = torch.where(visible[..., None], xy, -big).amax(dim=1)  # (N, 2)
    pad = (hi - lo) * margin
    wh = frame_wh.float()
    lo = torch.minimum(torch.clamp(lo - pad, min=0.0), wh)
    hi = torch.minimum(torch.clamp(hi + pad, min=0.0), wh)
    boxes = torch.cat((lo, hi), dim=1)  # (N, 4)
    enough = (visible.sum(dim=1) >= 2) & torch.isfinite(boxes).all(dim=1)
    return torch.where(enough[:, None], boxes, previous)


class ByteTracker:
    """Stable person ids for one source (Ultralytics' ByteTrack, fed our detections).

    ``update`` returns the tracked persons as Ultralytics' ``model.track`` would: boxes from the
    tracker, unconfirmed new tracks hidden, each with its id; ``reset`` starts afresh (a new stream).
    """

    def __init__(self, frame_rate: float = 30.0) -> None:
        from ultralytics.trackers.byte_tracker import BYTETracker
        from ultralytics.utils import YAML, IterableSimpleNamespace
        from ultralytics.utils.checks import check_yaml

        args = IterableSimpleNamespace(**YAML.load(check_yaml("bytetrack.yaml")))
        # A lost track is kept track_buffer frames at 30 fps: about a second whatever the rate.
        args.track_buffer = max(1, round(args.track_buffer * (frame_rate or 30.0) / 30.0))
        self._make = lambda: BYTETracker(args=args)
        self._tracker = self._make()

    def reset(self) -> None:
        self._tracker = self._make()

    def update(self, detections: Detections, image_rgb: np.ndarray) -> Detections:
        from ultralytics.engine.results import Boxes

        n = len(detections)
        data = np.concatenate([detections.boxes, detections.scores[:, None], np.zeros((n, 1), np.float32)], axis=1)
        boxes = Boxes(data.reshape(n, 6), image_rgb.shape[:2])
        tracks = self._tracker.update(boxes, image_rgb[:, :, ::-1])
        if len(tracks) == 0:
            return Detections.empty()
        tracks = np.asarray(tracks, dtype=np.float64)  # (M, 8): x1 y1 x2 y2 id score cls index
        order = np.argsort(-tracks[:, 5], kind="stable")
        tracks = tracks[order]
        return Detections(tracks[:, :4], tracks[:, 5], tracks[:, 4].astype(np.int64))
