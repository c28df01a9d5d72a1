"""Annotators: draw a FrameResult onto an RGB image.

Every annotator takes its style in ``__init__`` and exposes ``annotate(image, result) -> image``.
``image`` is (H, W, 3) uint8 RGB; it is drawn on in place when it is C-contiguous and writable
(otherwise a copy is), and the annotated image is returned: always use the return value. Colours
are RGB tuples, which cv2 draws unchanged on RGB arrays. Skeletons and palettes come from the
Sapiens2 metadata tables, never from code.

``compose_annotators(["matte", "seg", "boxes", "pose", "hud"])`` builds an ``Annotator`` chain
that draws the layers bottom-up (background replacement first, text last) on a copy of the frame.
Costs per annotator: docs/PERFORMANCE.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import cv2
import numpy as np
from sapiens2_client.timing import RateMeter

from stages.metadata import Sapiens2Metadata, load_metadata
from stages.tasks import TASKS, load
from stages.types import FrameResult

Color = tuple[int, int, int]
BANNER_TEXT = "RANDOM WEIGHTS - outputs meaningless"
BANNER_COLOR: Color = (200, 0, 0)
# Track-id colours (RGB), a fixed table so a person keeps its colour while its id lives.
TRACK_PALETTE = np.array(
    [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
     [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212]],
    dtype=np.uint8,
)  # fmt: skip
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def _canvas(image: np.ndarray) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"annotate: expected (H, W, 3) uint8 RGB, got {getattr(image, 'shape', type(image))}")
    if image.flags.c_contiguous and image.flags.writeable:
        return image
    return np.ascontiguousarray(image).copy()


def _colors(table: np.ndarray) -> list[Color]:
    return [(int(r), int(g), int(b)) for r, g, b in np.asarray(table).tolist()]


def _line_width(image: np.ndarray) -> int:
    """Line thickness that reads at any size: 1 px at 480p, 3 px at 1080p."""
    return max(1, round(min(image.shape[:2]) / 400))


def _resize_to(array: np.ndarray, height: int, width: int, interpolation: int) -> np.ndarray:
    if array.shape[:2] == (height, width):
        return array
    return cv2.resize(array, (width, height), interpolation=interpolation)


def _cover(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` scaled to cover (height, width), its aspect kept, and centre-cropped to it (a portrait
    photo behind a landscape frame is cut at top and bottom, never stretched)."""
    h, w = image.shape[:2]
    scale = max(height / h, width / w)
    sh, sw = max(height, round(h * scale)), max(width, round(w * scale))
    scaled = _resize_to(image, sh, sw, cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)  # (sh, sw, 3)
    y, x = (sh - height) // 2, (sw - width) // 2
    return scaled[y : y + height, x : x + width]


class BaseAnnotator:
    """Interface: style in ``__init__``, ``annotate(image, result) -> image``.

    ``layer`` orders annotators in a composed chain (lower draws first).
    """

    layer: int = 5

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        raise NotImplementedError


class SkeletonAnnotator(BaseAnnotator):
    """Skeleton links, keypoint dots, and face landmarks as small dots, for scores > threshold."""

    layer = 3

    def __init__(
        self,
        metadata: Sapiens2Metadata | None = None,
        threshold: float = 0.3,
        thickness: int | None = None,
        draw_face: bool = True,
        antialias: bool = True,
    ) -> None:
        meta = metadata or load_metadata()
        self.threshold, self.thickness, self.draw_face = threshold, thickness, draw_face
        self.line_type = cv2.LINE_AA if antialias else cv2.LINE_8
        self.links = meta.skeleton_links.tolist()  # [(a, b), ...]
        self.link_colors = _colors(meta.link_colors)
        self.point_colors = _colors(meta.keypoint_colors)
        self.point_table = np.asarray(meta.keypoint_colors, np.uint8)  # (K, 3), for vectorised dots
        is_face = np.zeros(meta.num_keypoints, bool)
        is_face[meta.face_indices] = True
        self.is_face = is_face  # (K,)

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        kp = result.keypoints
        if kp is None or len(kp) == 0:
            return image
        if kp.xy.shape[1] != len(self.is_face):
            raise ValueError(
                f"SkeletonAnnotator: metadata has {len(self.is_face)} keypoints, result has {kp.xy.shape[1]}"
            )
        t = self.thickness or _line_width(image)
        radius, face_radius = t + 1, max(1, t // 2)
        visible = (kp.scores > self.threshold) & np.isfinite(kp.xy).all(axis=2)  # (N, K)
        points = np.where(visible[..., None], kp.xy, 0).round().astype(np.int32)  # (N, K, 2)
        for pts, vis in zip(points.tolist(), visible.tolist()):
            for (a, b), color in zip(self.links, self.link_colors):
                if vis[a] and vis[b]:
                    cv2.line(image, pts[a], pts[b], color, t, self.line_type)
            for k, (p, v) in enumerate(zip(pts, vis)):
                if v and not self.is_face[k]:
                    cv2.circle(image, p, radius, self.point_colors[k], -1, self.line_type)
        if self.draw_face:
            self._face_dots(image, points, visible & self.is_face, face_radius)
        return image

    def _face_dots(self, image: np.ndarray, points: np.ndarray, mask: np.ndarray, r: int) -> None:
        """All face landmarks as small square dots in one numpy write (238 per person: no per-dot calls)."""
        person, k = np.nonzero(mask)  # (M,)
        if len(k) == 0:
            return
        h, w = image.shape[:2]
        d = np.arange(-r, r + 1)
        dy, dx = (a.ravel() for a in np.meshgrid(d, d, indexing="ij"))
        ys = np.clip(points[person, k, 1][:, None] + dy, 0, h - 1)  # (M, (2r+1)^2)
        xs = np.clip(points[person, k, 0][:, None] + dx, 0, w - 1)
        image[ys, xs] = self.point_table[k][:, None, :]


class BoxAnnotator(BaseAnnotator):
    """Person boxes coloured by track id, labelled "#id score" (score only when untracked)."""

    layer = 2

    def __init__(
        self, thickness: int | None = None, show_score: bool = True, palette: np.ndarray = TRACK_PALETTE
    ) -> None:
        self.thickness, self.show_score = thickness, show_score
        self.palette = _colors(palette)

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        det = result.detections
        if len(det) == 0:
            return image
        t = self.thickness or _line_width(image)
        scale = max(0.4, min(image.shape[:2]) / 1800)
        boxes = np.nan_to_num(det.boxes).round().astype(np.int32).tolist()
        for (x0, y0, x1, y1), score, tid in zip(boxes, det.scores.tolist(), det.track_ids.tolist()):
            color = self.palette[tid % len(self.palette)] if tid >= 0 else self.palette[0]
            cv2.rectangle(image, (x0, y0), (x1, y1), color, t)
            parts = ([f"#{tid}"] if tid >= 0 else []) + ([f"{score:.2f}"] if self.show_score else [])
            if not parts:
                continue
            label = " ".join(parts)
            (tw, th), base = cv2.getTextSize(label, _FONT, scale, 1)
            ty = max(y0, th + base + 2)
            cv2.rectangle(image, (x0, ty - th - base - 2), (x0 + tw + 4, ty), color, -1)
            cv2.putText(image, label, (x0 + 2, ty - base), _FONT, scale, (0, 0, 0), 1, cv2.LINE_AA)
        return image


class SegmentationAnnotator(BaseAnnotator):
    """Body-part classes blended over the image with the metadata palette; background untouched."""

    layer = 1

    def __init__(self, metadata: Sapiens2Metadata | None = None, alpha: float = 0.5) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"SegmentationAnnotator: alpha must be in [0, 1], got {alpha}")
        meta = metadata or load_metadata()
        self.alpha = alpha
        self.background_id = meta.background_id
        lut = np.zeros((256, 3), np.uint8)  # every uint8 id maps somewhere: unknown ids draw black
        lut[: meta.num_classes] = meta.seg_palette
        self.lut = lut
        self.lut3 = np.ascontiguousarray(lut.reshape(256, 1, 3))  # applyColorMap's user colour map

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        seg = result.seg
        if seg is None:
            return image
        seg = _resize_to(np.asarray(seg, np.uint8), *image.shape[:2], cv2.INTER_NEAREST)
        mask = cv2.compare(seg, self.background_id, cv2.CMP_NE)  # (H, W) 255 where a body part
        x, y, w, h = cv2.boundingRect(mask)  # blend only the box around the people
        if w == 0 or h == 0:
            return image
        part = seg[y : y + h, x : x + w]
        colored = cv2.applyColorMap(part, self.lut3)  # (h, w, 3) = palette[seg], one pass
        roi = image[y : y + h, x : x + w]
        blended = cv2.addWeighted(roi, 1.0 - self.alpha, colored, self.alpha, 0.0)
        cv2.copyTo(blended, mask[y : y + h, x : x + w], roi)  # writes through the view into image
        return image


class MatteAnnotator(BaseAnnotator):
    """Put the person over a new background using the matte.

    mode "composite": predicted premultiplied foreground + (1 - alpha) * background (removes
    colour spill from the old background). mode "replace": alpha * frame + (1 - alpha) *
    background (uses the frame's own pixels; robust when the foreground prediction is poor).
    background: an RGB colour or an (h, w, 3) uint8 RGB image (scaled to cover the frame, its aspect
    kept, and centre-cropped).
    """

    layer = 0

    def __init__(self, background: Color | np.ndarray = (0, 177, 64), mode: str = "composite") -> None:
        if mode not in ("composite", "replace"):
            raise ValueError(f"MatteAnnotator: mode must be 'composite' or 'replace', got {mode!r}")
        if isinstance(background, np.ndarray):
            if background.ndim != 3 or background.shape[2] != 3 or background.dtype != np.uint8:
                raise ValueError(f"MatteAnnotator: background image must be (H, W, 3) uint8, got {background.shape}")
        elif len(background) != 3:
            raise ValueError(f"MatteAnnotator: background colour must be (r, g, b), got {background!r}")
        self.mode, self.background = mode, background
        self._cache: tuple[np.ndarray, np.ndarray] | None = None  # (uint8, float32) at the last frame size

    def _background(self, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cache is None or self._cache[0].shape[:2] != (height, width):
            if isinstance(self.background, np.ndarray):
                bg = np.ascontiguousarray(_cover(self.background, height, width))
            else:
                bg = np.empty((height, width, 3), np.uint8)
                bg[:] = np.asarray(self.background, np.uint8)
            self._cache = (bg, bg.astype(np.float32))
        return self._cache

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        matte = result.matte
        if matte is None:
            return image
        h, w = image.shape[:2]
        alpha = _resize_to(np.asarray(matte.alpha, np.float32), h, w, cv2.INTER_LINEAR).clip(0.0, 1.0)  # (H, W)
        bg, bg_float = self._background(h, w)
        inv = 1.0 - alpha  # (H, W)
        if self.mode == "replace":
            return cv2.blendLinear(image, bg, alpha, inv)
        fg = _resize_to(np.asarray(matte.foreground, np.float32), h, w, cv2.INTER_LINEAR)  # (H, W, 3)
        # fg * 255 + bg * (1 - alpha) with cv2 kernels (3x faster than the numpy expression)
        out = cv2.scaleAdd(fg, 255.0, cv2.multiply(bg_float, cv2.merge([inv, inv, inv])))
        return cv2.convertScaleAbs(out)  # rounds and saturates to uint8


class HudAnnotator(BaseAnnotator):
    """Status text: FPS, per-stage latency, drop counters, and a banner for random weights.

    FPS is counted per source, over one-second windows, with the same meter (sapiens2_client's
    RateMeter) as the fps in the published status messages, so the picture and the figures agree
    (one HUD serves every source of a run: one count for all of them would show their sum).
    ``clock`` returns seconds; injectable for tests.
    """

    layer = 9

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._meters: dict[str, RateMeter] = {}
        self._shown: str | None = None  # the source of the last frame annotated

    def _tick(self, source_id: str) -> None:
        meter = self._meters.get(source_id)
        if meter is None:
            meter = self._meters[source_id] = RateMeter(1.0, clock=self.clock)
        meter.tick()
        self._shown = source_id

    def fps_of(self, source_id: str | None) -> float | None:
        """The frame rate of a source, None until it has run for a first full second."""
        meter = self._meters.get(source_id) if source_id is not None else None
        if meter is None or self.clock() - meter.started < meter.window_s:
            return None
        return meter.rate

    @property
    def fps(self) -> float | None:
        return self.fps_of(self._shown)

    def lines(self, result: FrameResult) -> list[str]:
        """The text lines the HUD shows for this result."""
        fps = self.fps_of(result.frame.source_id)
        lines = [f"FPS {fps:.1f}" if fps is not None else "FPS --"]
        if result.latency_ms:
            lines.append("  ".join(f"{k} {v:.1f}ms" for k, v in result.latency_ms.items()))
        if any(result.drops.values()):
            lines.append("drops " + "  ".join(f"{k} {v}" for k, v in result.drops.items()))
        return lines

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        self._tick(result.frame.source_id)
        h, w = image.shape[:2]
        scale = max(0.4, min(h, w) / 1400)
        (_, th), base = cv2.getTextSize("Ag", _FONT, scale, 1)
        step, y = th + base + 4, 0
        if result.random_weights:
            banner_scale = scale * 1.4
            (bw, bh), bb = cv2.getTextSize(BANNER_TEXT, _FONT, banner_scale, 2)
            bar = bh + bb + 12
            image[:bar] = BANNER_COLOR
            cv2.putText(image, BANNER_TEXT, (max(4, (w - bw) // 2), bar - bb - 6), _FONT, banner_scale,
                        (255, 255, 255), 2, cv2.LINE_AA)  # fmt: skip
            y = bar
        lines = self.lines(result)
        width = max(cv2.getTextSize(s, _FONT, scale, 1)[0][0] for s in lines) + 8
        panel = image[y : y + step * len(lines) + 4, : min(w, width)]
        panel >>= 1  # darken under the text so it reads on any frame
        for i, text in enumerate(lines):
            cv2.putText(image, text, (4, y + (i + 1) * step - base), _FONT, scale, (255, 255, 255), 1, cv2.LINE_AA)
        return image


class SideViewAnnotator(BaseAnnotator):
    """A side view of the 3D keypoints in an inset (bottom right): depth Z to the right, Y down.

    The view fits all valid points of the frame with one scale on both axes (so proportions are
    true), draws each person's skeleton links whose ends are both valid and its body (non-face)
    points. It assumes the usual camera convention (+Y down the image, +Z away from the camera;
    docs/WIRE.md says what the model states). Nothing is drawn without 3D keypoints.
    """

    layer = 8

    def __init__(self, metadata: Sapiens2Metadata | None = None, size: float = 0.3) -> None:
        meta = metadata or load_metadata()
        self.size = size  # inset side as a fraction of the frame's shorter side
        self.links = meta.skeleton_links.tolist()
        self.link_colors = _colors(meta.link_colors)
        body = np.ones(meta.num_keypoints, bool)
        body[meta.face_indices] = False
        self.body = body  # (K,)

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        image = _canvas(image)
        k3 = result.keypoints3d
        if k3 is None or len(k3) == 0 or not k3.valid.any():
            return image
        h, w = image.shape[:2]
        side = max(48, int(min(h, w) * self.size))
        margin = max(4, side // 20)
        x0, y0 = w - side - margin, h - side - margin
        if x0 < 0 or y0 < 0:
            return image
        panel = image[y0 : y0 + side, x0 : x0 + side]
        panel >>= 2  # darken: the inset reads on any frame
        cv2.rectangle(image, (x0, y0), (x0 + side - 1, y0 + side - 1), (200, 200, 200), 1)
        zy = k3.xyz[..., [2, 1]]  # (N, K, 2): horizontal = Z (depth), vertical = Y
        pts = zy[k3.valid]
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        span = float(max(hi - lo)) * 1.15 or 1.0
        centre = (lo + hi) / 2.0
        pix = (zy - centre) / span * (side - 2 * margin) + side / 2.0  # (N, K, 2) inset pixels
        pix = np.round(pix + [x0, y0]).astype(np.int32)
        t = max(2, side // 120)
        for pts_i, vis in zip(pix.tolist(), k3.valid.tolist()):
            for (a, b), color in zip(self.links, self.link_colors):
                if vis[a] and vis[b]:
                    cv2.line(image, pts_i[a], pts_i[b], color, t, cv2.LINE_AA)
            for k, (p, v) in enumerate(zip(pts_i, vis)):
                if v and self.body[k]:
                    cv2.circle(image, p, t + 1, (255, 255, 255), -1, cv2.LINE_AA)
        scale = max(0.35, side / 600)
        label = "side view: Z ->  Y down" + ("" if k3.metric else " (canonical)")
        cv2.putText(image, label, (x0 + 4, y0 + side - 6), _FONT, scale, (230, 230, 230), 1, cv2.LINE_AA)
        return image


class Annotator:
    """A chain of annotators applied in order."""

    def __init__(self, annotators: Sequence[BaseAnnotator]) -> None:
        self.annotators = list(annotators)

    def annotate(self, image: np.ndarray, result: FrameResult) -> np.ndarray:
        """Apply every annotator to ``image`` (drawn in place where possible); returns the result."""
        for annotator in self.annotators:
            image = annotator.annotate(image, result)
        return image

    def __call__(self, result: FrameResult) -> np.ndarray:
        """Annotate a copy of ``result.frame.image``; the frame itself stays untouched."""
        return self.annotate(result.frame.image.copy(), result)


_LAYERS: dict[str, Callable[[Sapiens2Metadata], BaseAnnotator]] = {
    "matte": lambda m: MatteAnnotator(),
    "seg": lambda m: SegmentationAnnotator(m),
    "boxes": lambda m: BoxAnnotator(),
    "pose": lambda m: SkeletonAnnotator(m),
    "side3d": lambda m: SideViewAnnotator(m),
    "hud": lambda m: HudAnnotator(),
}
_ALIASES = {"matting": "matte", "segmentation": "seg", "detect": "boxes", "detections": "boxes",
            "skeleton": "pose", "keypoints": "pose"}  # fmt: skip


def compose_annotators(
    tasks: Iterable[str | BaseAnnotator], metadata: Sapiens2Metadata | None = None
) -> Annotator:
    """Build a chain from task names (matte, seg, boxes, pose, side3d, hud) and/or annotator instances.

    Names get default styles; the chain is ordered by layer (matte, seg, boxes, pose, side3d, hud) so
    text is never painted over, whatever order the tasks are listed in.
    """
    meta = metadata or load_metadata()
    registered = {spec.layer: spec.annotator for spec in TASKS.values() if spec.annotator}  # (stages.tasks)
    built: list[BaseAnnotator] = []
    for task in tasks:
        if isinstance(task, BaseAnnotator):
            built.append(task)
            continue
        name = _ALIASES.get(task, task)
        if name in _LAYERS:
            built.append(_LAYERS[name](meta))
        elif name in registered:
            built.append(load(registered[name])())
        else:
            choices = ", ".join(dict.fromkeys([*_LAYERS, *registered]))
            raise ValueError(f"unknown annotation task {task!r}; choose from {choices}")
    return Annotator(sorted(built, key=lambda a: a.layer))
