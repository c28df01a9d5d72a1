"""Annotators change the pixels they should, with the metadata's colours, and no others."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from stages.annotate import (
    BANNER_COLOR,
    TRACK_PALETTE,
    BoxAnnotator,
    HudAnnotator,
    MatteAnnotator,
    SegmentationAnnotator,
    SideViewAnnotator,
    SkeletonAnnotator,
    compose_annotators,
)
from stages.metadata import load_metadata
from stages.types import Detections, Frame, FrameResult, Keypoints, Keypoints3D, Matte

H, W = 240, 320
GREY = 40


def _result(image: np.ndarray | None = None, n: int = 1, source_id: str = "cam0", **kwargs: object) -> FrameResult:
    image = np.full((H, W, 3), GREY, np.uint8) if image is None else image
    boxes = np.tile(np.array([[20, 20, 200, 220]], np.float32), (n, 1))
    det = Detections(boxes, np.full(n, 0.9), np.arange(n) + 3)
    return FrameResult(Frame(0, image, 0, None, 0, source_id=source_id), det, **kwargs)


def _keypoints(points: dict[int, tuple[float, float]], score: float = 0.9) -> Keypoints:
    k = load_metadata().num_keypoints
    xy = np.zeros((1, k, 2), np.float32)
    scores = np.zeros((1, k), np.float32)
    for i, p in points.items():
        xy[0, i] = p
        scores[0, i] = score
    return Keypoints(xy, scores)


def test_skeleton_link_is_drawn_between_its_keypoints() -> None:
    meta = load_metadata()
    (a, b), color = meta.skeleton_links[0], meta.link_colors[0]
    face = int(meta.face_indices[0])
    result = _result(keypoints=_keypoints({int(a): (40, 120), int(b): (280, 120), face: (160, 30)}))
    out = SkeletonAnnotator(thickness=3).annotate(result.frame.image.copy(), result)
    np.testing.assert_array_equal(out[120, 160], color)  # middle of the link
    np.testing.assert_array_equal(out[121, 100], color)
    np.testing.assert_array_equal(out[120, 40], meta.keypoint_colors[a])  # endpoint dot on top
    assert (out[30, 160] != GREY).any()  # face landmark dot
    assert (out[60:100] == GREY).all()  # nothing between the link and the face dot
    assert (out[140:] == GREY).all()


def test_skeleton_skips_low_scores_and_leaves_input_shape() -> None:
    meta = load_metadata()
    a, b = (int(i) for i in meta.skeleton_links[0])
    result = _result(keypoints=_keypoints({a: (40, 120), b: (280, 120)}, score=0.2))
    out = SkeletonAnnotator(threshold=0.3).annotate(result.frame.image.copy(), result)
    assert (out == GREY).all()
    empty = _result(n=0, keypoints=Keypoints.empty())
    assert (SkeletonAnnotator().annotate(empty.frame.image.copy(), empty) == GREY).all()


def test_segmentation_overlay_colours_the_right_region() -> None:
    meta = load_metadata()
    torso = int(np.flatnonzero(meta.seg_class_names == "Torso")[0])
    seg = np.full((H, W), meta.background_id, np.uint8)
    seg[50:100, 60:120] = torso
    result = _result(seg=seg)
    out = SegmentationAnnotator(alpha=0.5).annotate(result.frame.image.copy(), result)
    expected = np.round(0.5 * GREY + 0.5 * meta.seg_palette[torso].astype(float))
    np.testing.assert_allclose(out[50:100, 60:120].reshape(-1, 3), np.tile(expected, (50 * 60, 1)), atol=1)
    outside = np.ones((H, W), bool)
    outside[50:100, 60:120] = False
    assert (out[outside] == GREY).all()  # background untouched


def test_segmentation_full_alpha_is_palette() -> None:
    meta = load_metadata()
    seg = (np.arange(H * W) % meta.num_classes).astype(np.uint8).reshape(H, W)
    result = _result(seg=seg)
    out = SegmentationAnnotator(alpha=1.0).annotate(result.frame.image.copy(), result)
    body = seg != meta.background_id
    np.testing.assert_array_equal(out[body], meta.seg_palette[seg[body]])


def test_boxes_use_track_colour() -> None:
    result = _result()
    out = BoxAnnotator(thickness=2).annotate(result.frame.image.copy(), result)
    np.testing.assert_array_equal(out[120, 200], TRACK_PALETTE[3])  # right edge of the box, id 3
    assert (out[120, 100] == GREY).all()  # inside the box


@pytest.mark.parametrize("mode", ["composite", "replace"])
def test_matte_puts_person_over_background(mode: str) -> None:
    image = np.full((H, W, 3), 200, np.uint8)
    alpha = np.zeros((H, W), np.float32)
    alpha[:, : W // 2] = 1.0
    fg = np.zeros((H, W, 3), np.float32)
    fg[:, : W // 2] = 100 / 255  # premultiplied foreground differs from the frame
    result = _result(image=image, matte=Matte(alpha, fg))
    out = MatteAnnotator(background=(0, 0, 255), mode=mode).annotate(image.copy(), result)
    person = 100 if mode == "composite" else 200
    assert (out[:, : W // 2] == person).all()
    assert (out[:, W // 2 :] == (0, 0, 255)).all()


def test_matte_background_image_is_resized() -> None:
    bg = np.zeros((10, 20, 3), np.uint8)
    bg[:] = (1, 2, 3)
    result = _result(matte=Matte(np.zeros((H // 2, W // 2), np.float32), np.zeros((H // 2, W // 2, 3), np.float32)))
    out = MatteAnnotator(background=bg, mode="replace").annotate(result.frame.image.copy(), result)
    assert (out == (1, 2, 3)).all()


@pytest.mark.parametrize("shape", [(200, 100), (50, 400)], ids=["portrait", "panorama"])
def test_matte_background_image_covers_the_frame_keeping_its_aspect(shape: tuple[int, int]) -> None:
    """A portrait (or panorama) photo behind a 4:3 frame is scaled to cover it and centre-cropped: the ring of
    green along its edge that a stretch would show is cut away, and a centred disc stays round."""
    h, w = shape
    bg = np.zeros((h, w, 3), np.uint8)
    bg[:] = (0, 255, 0)  # the edge band, cut off by the crop on the long side
    edge = max(h, w) // 5
    bg[edge : h - edge, :] = (128, 128, 128) if h > w else bg[edge : h - edge, :]
    bg[:, edge : w - edge] = (128, 128, 128) if w > h else bg[:, edge : w - edge]
    radius = min(h, w) // 4
    cv2.circle(bg, (w // 2, h // 2), radius, (255, 0, 0), -1)
    result = _result(matte=Matte(np.zeros((H, W), np.float32), np.zeros((H, W, 3), np.float32)))
    out = MatteAnnotator(background=bg, mode="replace").annotate(result.frame.image.copy(), result)
    assert out.shape == (H, W, 3)
    assert not (out == (0, 255, 0)).all(axis=2).any(), "the long side's edge is shown: stretched, not cropped"
    disc = (out == (255, 0, 0)).all(axis=2)  # (H, W)
    rows, cols = np.nonzero(disc.any(axis=1))[0], np.nonzero(disc.any(axis=0))[0]
    assert abs(len(rows) - len(cols)) <= 2, f"the disc is {len(rows)} x {len(cols)} pixels: stretched"


def test_hud_banner_only_with_random_weights() -> None:
    now = [0.0]
    hud = HudAnnotator(clock=lambda: now[0])
    flagged = _result(random_weights=True, latency_ms={"pose": 12.5}, drops={"source": 2})
    out = hud.annotate(flagged.frame.image.copy(), flagged)
    banner = (out[:12] == BANNER_COLOR).all(axis=2).mean()
    assert banner > 0.5
    assert hud.lines(flagged) == ["FPS --", "pose 12.5ms", "drops source 2"]  # not a full second yet
    plain = _result()
    for _ in range(40):  # 25 frames a second
        now[0] += 0.04
        out = hud.annotate(plain.frame.image.copy(), plain)
    assert not (out == BANNER_COLOR).all(axis=2).any()
    assert hud.fps == pytest.approx(25.0, rel=0.05)
    assert (out[H // 2 :] == GREY).all()  # text stays in the corner


def test_hud_counts_each_source_apart() -> None:
    """One HUD draws every source of a run: two cameras at 10 fps each are 10 fps each, not 20."""
    now = [0.0]
    hud = HudAnnotator(clock=lambda: now[0])
    for i in range(60):
        now[0] += 0.05  # 20 frames a second in all, alternating
        result = _result(source_id="a" if i % 2 else "b")
        hud.annotate(result.frame.image.copy(), result)
    assert hud.fps_of("a") == pytest.approx(10.0, rel=0.1) and hud.fps_of("b") == pytest.approx(10.0, rel=0.1)
    assert hud.lines(_result(source_id="a"))[0] == f"FPS {hud.fps_of('a'):.1f}"


def test_compose_orders_layers_and_keeps_the_frame() -> None:
    chain = compose_annotators(["hud", "pose", "seg", "boxes", "matting"])
    kinds = [type(a) for a in chain.annotators]
    assert kinds == [MatteAnnotator, SegmentationAnnotator, BoxAnnotator, SkeletonAnnotator, HudAnnotator]
    result = _result(random_weights=True)
    out = chain(result)
    assert (result.frame.image == GREY).all()
    assert out is not result.frame.image and (out != GREY).any()
    with pytest.raises(ValueError, match="unknown annotation task 'depth'"):
        compose_annotators(["depth"])


def test_side_view_draws_a_link_in_its_inset_only() -> None:
    meta = load_metadata()
    k = meta.num_keypoints
    (a, b), color = (int(i) for i in meta.skeleton_links[0]), meta.link_colors[0]
    xyz, valid = np.zeros((1, k, 3), np.float32), np.zeros((1, k), bool)
    xyz[0, a], xyz[0, b] = (0.0, 1.0, 2.0), (0.0, 1.0, 3.0)  # one link straight along the depth axis
    valid[0, [a, b]] = True
    k3 = Keypoints3D(xyz, valid, np.zeros((1, 3), np.float32), np.zeros(1, bool))
    annotator = SideViewAnnotator(size=0.5)
    out = annotator.annotate(_result().frame.image.copy(), _result(keypoints3d=k3))
    side = int(min(H, W) * 0.5)
    margin = max(4, side // 20)
    x0, y0 = W - side - margin, H - side - margin
    assert (out[:y0] == GREY).all() and (out[:, :x0] == GREY).all()  # nothing outside the inset
    centre_row = y0 + side // 2  # the link is horizontal (constant Y) through the inset's middle
    np.testing.assert_array_equal(out[centre_row, x0 + side // 2], color)
    assert (out[y0 + 5 : y0 + side // 4, x0 + 5 : x0 + side - 5] == GREY >> 2).all()  # darkened, nothing drawn
    # nothing to show: nothing drawn, not even the inset
    untouched = annotator.annotate(_result().frame.image.copy(), _result())
    assert (untouched == GREY).all()


def test_rejects_bad_images() -> None:
    with pytest.raises(ValueError, match=r"expected \(H, W, 3\) uint8 RGB"):
        BoxAnnotator().annotate(np.zeros((H, W), np.uint8), _result())


def test_full_hd_two_persons_chain_draws() -> None:
    rng = np.random.default_rng(0)
    h, w = 1080, 1920
    image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    det = Detections(np.array([[100, 100, 700, 1000], [900, 50, 1500, 1050]], np.float32), [0.9, 0.8], [1, 2])
    lo, hi = det.boxes[:, None, :2], det.boxes[:, None, 2:]
    kp = Keypoints(rng.uniform(lo, hi, (2, 308, 2)), np.ones((2, 308), np.float32))
    seg = np.zeros((h, w), np.uint8)
    seg[100:1000, 100:700] = rng.integers(1, 29, (900, 600))
    seg[50:1050, 900:1500] = 22
    result = FrameResult(Frame(0, image, 0, None, 0), det, kp, seg=seg, latency_ms={"pose": 20.0}, random_weights=True)
    layers = ["seg", "boxes", "pose", "hud"]
    out = compose_annotators(layers)(result)  # speed is measured by bench/bench_overhead.py, not asserted here
    assert out.shape == image.shape and out.dtype == np.uint8
    assert np.array_equal(result.frame.image, image)  # the chain drew on a copy
    # Every layer drew where it should: each one left out changes the picture there.
    for layer, (ys, xs) in {"seg": (slice(500, 520), slice(1200, 1220)),  # inside person 2's class-22 area
                            "boxes": (slice(100, 101), slice(300, 500)),  # person 1's top edge
                            "hud": (slice(0, 20), slice(0, w))}.items():  # the random-weights banner
        without = compose_annotators([x for x in layers if x != layer])(result)
        assert not np.array_equal(out[ys, xs], without[ys, xs]), f"the {layer} layer drew nothing there"
    without_pose = compose_annotators(["seg", "boxes", "hud"])(result)
    changed = np.any(out != without_pose, axis=2)
    x, y = kp.xy[0, 5].astype(int)
    assert changed[y - 3:y + 4, x - 3:x + 4].any(), "no keypoint dot drawn at a keypoint"
    assert not changed[1060:, 1700:].any(), "the skeleton drew outside both persons"
