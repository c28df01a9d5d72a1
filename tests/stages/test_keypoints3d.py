"""3D keypoints: the 2D keypoints sampled from the post-processed pointmap (stages.keypoints3d), in
the engine and against the reference implementation's pointmap.

Sampling is checked exactly on synthetic maps with known values (a plane, a sphere), validity case
by case, and end to end: the engine's 3D keypoints equal the transformers reference's
post-processed pointmap sampled at the engine's own 2D keypoints by an independent bilinear.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
import torch
from transformers import Sapiens2ImageProcessor

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.keypoints3d import Lift, lift, relative, sample_bilinear, sample_median, smooth3d
from stages.sapiens2 import load_model
from stages.sapiens2.estimators import PointmapEstimator, estimator_for
from stages.sapiens2.tiny import make_tiny
from stages.smoothing import KeypointSmoother
from stages.types import Detections, Frame
from tests.refutil import reference_model

H, W = 40, 56


def _plane() -> np.ndarray:
    """(H, W, 3): X, Y, Z affine in the pixel position: bilinear interpolation is exact anywhere."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    return np.stack([0.01 * x - 0.2, 0.02 * y + 0.1, 2.0 + 0.003 * x - 0.004 * y], axis=-1).astype(np.float32)


def _plane_at(xy: np.ndarray) -> np.ndarray:
    x, y = xy[..., 0].astype(np.float64), xy[..., 1].astype(np.float64)
    return np.stack([0.01 * x - 0.2, 0.02 * y + 0.1, 2.0 + 0.003 * x - 0.004 * y], axis=-1)


def _bilinear(points: np.ndarray, xy: np.ndarray, on: np.ndarray | None = None) -> np.ndarray:
    """An independent bilinear (float64, clamped to the map): the value tests compare against; with ``on``
    (H, W bool), only the pixels on the person, their weights renormalised."""
    h, w = points.shape[:2]
    x, y = np.clip(xy[..., 0], 0, w - 1), np.clip(xy[..., 1], 0, h - 1)
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    p = points.astype(np.float64)
    corners = ((y0, x0, (1 - fx) * (1 - fy)), (y0, x1, fx * (1 - fy)), (y1, x0, (1 - fx) * fy), (y1, x1, fx * fy))
    weights = [wt if on is None else wt * on[ys, xs][..., None] for ys, xs, wt in corners]
    total = sum(weights)
    return sum(p[ys, xs] * wt for (ys, xs, _), wt in zip(corners, weights)) / np.where(total > 0, total, np.nan)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


# -- sampling on synthetic maps ----------------------------------------------------------------
def test_bilinear_on_a_plane_is_exact_at_any_position() -> None:
    rng = np.random.default_rng(0)
    xy = np.stack([rng.uniform(0, W - 1, (3, 17)), rng.uniform(0, H - 1, (3, 17))], -1).astype(np.float32)
    xy[0, :4] = [[0, 0], [W - 1, H - 1], [W - 1, 0], [0, H - 1]]  # the corners: the border pixels themselves
    got = sample_bilinear(_t(_plane()), _t(xy)).numpy()
    assert got.shape == (3, 17, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, _plane_at(xy), atol=2e-6)


def test_a_sphere_gives_its_own_values_at_whole_pixels_and_the_bilinear_mix_between() -> None:
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    r, cx, cy = 40.0, W / 2, H / 2  # covers the whole map
    depth = np.sqrt(r**2 - (x - cx) ** 2 - (y - cy) ** 2)  # the near half of a sphere seen along Z
    sphere = np.stack([(x - cx) / 10, (y - cy) / 10, 5.0 - depth / 10], -1).astype(np.float32)
    whole = np.array([[[3, 4], [28, 20], [55, 39], [0, 0]]], np.float32)
    got = sample_bilinear(_t(sphere), _t(whole)).numpy()
    assert np.array_equal(got, sphere[whole[..., 1].astype(int), whole[..., 0].astype(int)])  # bit for bit
    between = np.array([[[3.25, 4.5], [27.9, 19.01], [54.5, 38.5]]], np.float32)
    np.testing.assert_allclose(sample_bilinear(_t(sphere), _t(between)).numpy(), _bilinear(sphere, between),
                               rtol=1e-6, atol=1e-6)


def test_a_non_finite_pixel_only_counts_where_it_has_weight() -> None:
    points = _plane()
    points[10, 20] = np.nan
    xy = np.array([[[21, 10], [20.5, 10], [20, 10]]], np.float32)  # next to it (weight 0), half on it, on it
    got = sample_bilinear(_t(points), _t(xy)).numpy()[0]
    np.testing.assert_allclose(got[0], points[10, 21], atol=0)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()


def test_the_median_window_ignores_an_outlier_and_unusable_pixels() -> None:
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    points = np.stack([0.01 * x, 0.02 * y, 2.0 + 0.003 * x], -1)  # each axis monotone in one direction only

    def at(px: int, py: int) -> np.ndarray:
        return np.float32([0.01 * px, 0.02 * py, 2.0 + 0.003 * px])

    points[20, 30] = [50.0, -50.0, 900.0]  # one wild pixel under the keypoint
    xy = _t(np.array([[[30, 20]]], np.float32))
    assert np.allclose(sample_bilinear(_t(points), xy).numpy(), [50.0, -50.0, 900.0])  # one sample takes it
    median = sample_median(_t(points), xy, 3).numpy()[0, 0]
    np.testing.assert_allclose(median, at(30, 20), atol=1e-6)  # 3x3 median, per axis: the smooth value
    # NaN pixels and pixels off the person are not candidates; none left: NaN
    seg = np.zeros((H, W), np.uint8)
    seg[19:22, 31] = 5  # only the right column of the window is on the person
    points[19, 31] = np.nan  # and one of those is a hole
    on_right = sample_median(_t(points), xy, 3, seg=_t(seg)).numpy()[0, 0]
    np.testing.assert_allclose(on_right, np.minimum(at(31, 20), at(31, 21)), atol=1e-6)  # lower middle of 2
    nowhere = sample_median(_t(points), xy, 3, seg=_t(np.zeros((H, W), np.uint8))).numpy()
    assert np.isnan(nowhere).all()


# -- validity and the root ---------------------------------------------------------------------
def _person(k: int = 12) -> tuple[np.ndarray, np.ndarray]:
    xy = np.stack([np.linspace(5, 50, k), np.linspace(4, 35, k)], -1)[None].astype(np.float32)  # (1, K, 2)
    return xy, np.full((1, k), 0.9, np.float32)


def test_low_score_off_person_and_nan_points_are_invalid_zeros() -> None:
    xy, scores = _person()
    scores[0, 1] = 0.1  # below the threshold
    points = _plane()
    x2, y2 = xy[0, 2].round().astype(int)
    points[y2, x2] = np.nan  # a hole in the map under keypoint 2
    seg = np.full((H, W), 3, np.uint8)
    x3, y3 = xy[0, 3].round().astype(int)
    seg[y3, x3] = 0  # keypoint 3 sits on the background
    rule = Lift(threshold=0.3, hips=(9, 10))
    xyz, valid, root, root_valid = (t.numpy() for t in lift(_t(points), _t(xy), _t(scores), rule, seg=_t(seg)))
    assert valid[0].tolist() == [True, False, False, False] + [True] * 8
    assert not xyz[~valid].any() and np.isfinite(xyz).all()
    np.testing.assert_allclose(xyz[valid], _bilinear(points, xy)[valid], atol=2e-6)
    np.testing.assert_allclose(root[0], xyz[0, [9, 10]].mean(axis=0), atol=1e-6)
    assert root_valid.tolist() == [True]
    # the matte decides instead when there is no segmentation
    alpha = np.ones((H, W), np.float32)
    alpha[y3, x3] = 0.2
    _, by_matte, _, _ = lift(_t(_plane()), _t(xy), _t(np.full((1, 12), 0.9, np.float32)), rule, alpha=_t(alpha))
    assert by_matte.numpy()[0].tolist() == [True] * 3 + [False] + [True] * 8


@pytest.mark.parametrize("mask", ["seg", "alpha"])
def test_a_keypoint_on_the_outline_takes_the_persons_depth_not_the_walls(mask: str) -> None:
    """The person (Z=2) covers columns 0..10, the wall behind (Z=5) the rest: a keypoint at x=10.4 is on the
    person (its nearest pixel is), and its bilinear sample mixes only the person's pixels."""
    points = torch.zeros(20, 20, 3)
    points[..., 2] = 5.0
    points[:, :11, 2] = 2.0
    on = torch.zeros(20, 20, dtype=torch.bool)
    on[:, :11] = True
    maps = {"seg": on.to(torch.uint8)} if mask == "seg" else {"alpha": on.float()}
    xyz, valid, _, _ = lift(points, torch.tensor([[[10.4, 5.0], [3.5, 5.5]]]), torch.ones(1, 2), Lift(1, hips=(0, 1)),
                            **maps)
    assert valid.all()
    assert xyz[0, :, 2].tolist() == [2.0, 2.0]
    unmasked, _, _, _ = lift(points, torch.tensor([[[10.4, 5.0]]]), torch.ones(1, 1), Lift(1, hips=(0, 0)))
    assert float(unmasked[0, 0, 2]) == pytest.approx(2.0 * 0.6 + 5.0 * 0.4)  # without a mask: plain bilinear


def test_the_root_is_the_valid_hip_or_nothing() -> None:
    xy, scores = _person()
    rule = Lift(threshold=0.3, hips=(9, 10))
    scores[0, 10] = 0.0
    xyz, _, root, root_valid = lift(_t(_plane()), _t(xy), _t(scores), rule)
    np.testing.assert_allclose(root.numpy()[0], xyz.numpy()[0, 9])  # one hip seen: that hip
    scores[0, 9] = 0.0
    _, _, root, root_valid = lift(_t(_plane()), _t(xy), _t(scores), rule)
    assert root_valid.numpy().tolist() == [False] and not root.numpy().any()
    xyz, valid, root, root_valid = lift(_t(_plane()), _t(np.concatenate([xy, xy])), _t(np.full((2, 12), 0.9,
                                                                                              np.float32)), rule)
    rel, ok = relative(xyz, valid, root, root_valid)
    np.testing.assert_allclose(rel.numpy(), (xyz - root[:, None]).numpy(), atol=1e-7)
    assert ok.all()


def test_a_smoothed_point_that_is_not_finite_is_not_published_as_valid() -> None:
    """A track first seen with an invalid point, then valid at the same timestamp (a clock that repeats): the
    filter has no finite value to give; the point is invalid, and the root does not average it in as zeros."""
    smoother = KeypointSmoother(1.0, 0.05)
    xyz, ids = np.full((1, 12, 3), 2.0, np.float32), np.array([0])
    smooth3d(smoother, xyz, np.zeros((1, 12), bool), ids, 10.0, (9, 10))
    out, valid, root, root_valid = smooth3d(smoother, xyz, np.ones((1, 12), bool), ids, 10.0, (9, 10))
    assert np.isfinite(out).all() and np.isfinite(root).all()
    assert not valid.any() and not root_valid.any()
    out, valid, root, root_valid = smooth3d(smoother, xyz, np.ones((1, 12), bool), ids, 10.1, (9, 10))
    assert valid.all() and root_valid.all() and np.allclose(root, 2.0)  # the next frame has a value again


def test_lift_rejects_an_even_window() -> None:
    with pytest.raises(ValueError, match="odd"):
        Lift(window=4)


# -- the engine ----------------------------------------------------------------------------------
class TwoPeople:
    random_weights = False

    def detect_batch(self, images: list[np.ndarray]) -> list[Detections]:
        boxes = np.array([[10, 10, 120, 140], [100, 20, 250, 148]], np.float32)
        return [Detections(boxes, np.ones(2, np.float32), np.arange(2)) for _ in images]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Tiny pose and seg; the pointmap is the transformers reference model's own checkpoint."""
    out = {}
    for task in ("pose", "seg"):
        model = load_model(make_tiny(tmp_path_factory.mktemp(task), task), device="cpu")
        out[task] = estimator_for(task)(model, input_size=tuple(model.cfg.image_size))
    ref = reference_model("pointmap")
    folder = tmp_path_factory.mktemp("pointmap")
    ref.save_pretrained(folder)
    out["pointmap"] = PointmapEstimator(folder, device="cpu")
    out["reference"] = ref
    return out


def _engine(models: dict, tasks: tuple[str, ...], **kwargs) -> FrameEngine:
    stages = Stages(torch.device("cpu"), TwoPeople(), {t: models[t] for t in tasks})
    return FrameEngine(stages, **kwargs)


def _frames(n: int, session: int = 0) -> list[Frame]:
    rng = np.random.default_rng(7)
    return [Frame(i, rng.integers(0, 256, (150, 260, 3), dtype=np.uint8), None, None, time.time_ns() + i * 33_000_000,
                  session=session) for i in range(n)]


def _reference_pointmap(models: dict, image: np.ndarray) -> np.ndarray:
    """The reference's post-processed pointmap (padding removed, divided by the scale, resized): (H, W, 3)."""
    proc = Sapiens2ImageProcessor(size={"height": 128, "width": 96}, do_pad=True)
    with torch.no_grad():
        out = models["reference"](proc(image, return_tensors="pt")["pixel_values"])
    return proc.post_process_pointmap_estimation(out, source_sizes=[image.shape[:2]])[0]["pointmap"].permute(
        1, 2, 0).numpy()


def test_engine_3d_keypoints_are_the_reference_pointmap_at_the_keypoints(models: dict) -> None:
    engine = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.0))
    for frame in _frames(2):
        result = engine.finish(engine.submit(frame), False)
        k3, kp = result.keypoints3d, result.keypoints
        assert k3.xyz.shape == (2, 308, 3) and k3.metric  # the reference model has its scale branch
        expected_map = _reference_pointmap(models, frame.image)
        tol = 1e-4 * max(1.0, np.abs(expected_map).max())
        assert np.abs(result.pointmap - expected_map).max() <= tol
        assert k3.valid.all()  # threshold 0, no mask, a finite map: every keypoint
        assert np.abs(k3.xyz - _bilinear(expected_map, kp.xy)).max() <= tol
        np.testing.assert_allclose(k3.root, k3.xyz[:, [9, 10]].mean(axis=1), atol=1e-5)


def test_engine_validity_follows_scores_and_the_segmentation(models: dict) -> None:
    engine = _engine(models, ("pose", "seg", "pointmap"), kpt_threshold=0.3, keypoints3d=Lift(threshold=0.3))
    result = engine.finish(engine.submit(_frames(1)[0]), False)
    k3, kp = result.keypoints3d, result.keypoints
    nearest = np.clip(np.round(kp.xy), 0, [259, 149]).astype(int)
    on_person = result.seg[nearest[..., 1], nearest[..., 0]] != 0
    expected = (kp.scores >= 0.3) & on_person
    assert expected.any() and (~expected).any()  # both cases occur on this frame
    assert np.array_equal(k3.valid, expected)
    assert not k3.xyz[~k3.valid].any()
    want = _bilinear(result.pointmap, kp.xy, result.seg != 0)  # the person's pixels only
    np.testing.assert_allclose(k3.xyz[k3.valid], want[k3.valid], atol=1e-4)


def test_a_frame_that_reuses_its_map_has_no_pointmap_time_in_a_step_where_another_ran(models: dict) -> None:
    """Two sources in one step: the one whose pointmap ran reports its time, the one that reused its last map
    does not (the step's pointmap time is not its own)."""
    engine = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.0), pointmap_every=2)
    a0, a1 = (Frame(f.index, f.image, None, None, f.capture_ns, "a") for f in _frames(2))
    b0 = Frame(0, a0.image, None, None, a0.capture_ns, "b")
    engine.finish_batch(engine.submit_batch([a0]), False)
    second = {r.frame.source_id: r for r in engine.finish_batch(engine.submit_batch([a1, b0]), False)}
    assert "pointmap" not in second["a"].latency_ms and "keypoints3d" in second["a"].latency_ms
    assert "pointmap" in second["b"].latency_ms


def test_pointmap_every_n_reuses_the_last_map_at_the_new_keypoints(models: dict) -> None:
    engine = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.0), pointmap_every=3)
    calls = []
    real = models["pointmap"].run_batch

    def counting(images):
        calls.append(len(images))
        return real(images)

    models["pointmap"].run_batch = counting
    try:
        frames = _frames(5)
        frames[1] = Frame(1, np.ascontiguousarray(frames[1].image[:, ::-1]), None, None, frames[1].capture_ns)
        results = [engine.finish(engine.submit(f), False) for f in frames]
        new_session = engine.finish(engine.submit(_frames(1, session=1)[0]), False)
    finally:
        del models["pointmap"].run_batch
    assert len(calls) == 3  # frames 0 and 3, and the new session's first frame
    assert np.array_equal(results[1].pointmap, results[0].pointmap)
    assert np.array_equal(results[2].pointmap, results[0].pointmap)
    assert not np.array_equal(results[3].pointmap, results[0].pointmap)
    assert not np.array_equal(results[1].keypoints.xy, results[0].keypoints.xy)  # a different picture
    for i in (1, 2, 4):  # the older map, sampled where the keypoints are now
        got = results[i].keypoints3d.xyz
        assert np.abs(got - _bilinear(results[i].pointmap, results[i].keypoints.xy)).max() < 1e-4
    assert new_session.keypoints3d is not None
    # only the frames that ran the forward report its time ("only the stages that ran", WIRE.md)
    assert ["pointmap" in r.latency_ms for r in results] == [True, False, False, True, False]


def test_smoothing_applies_to_3d_as_to_2d(models: dict) -> None:
    raw = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.3))
    smooth = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.3), smoother=KeypointSmoother(),
                     beta3d=15.0)
    reference = KeypointSmoother(beta=15.0)  # the 3D filter's own speed coefficient (the 2D one is per pixel)
    frames = _frames(3)
    frames = [Frame(i, f.image if i % 2 == 0 else np.ascontiguousarray(f.image[::-1]), None, None, f.capture_ns)
              for i, f in enumerate(frames)]
    for frame in frames:
        a = raw.finish(raw.submit(frame), False).keypoints3d
        b = smooth.finish(smooth.submit(frame), False).keypoints3d
        want = reference(np.where(a.valid[..., None], a.xyz, np.nan), np.arange(2), frame.capture_ns / 1e9)
        assert np.array_equal(b.valid, a.valid)
        np.testing.assert_allclose(b.xyz[b.valid], want[b.valid], atol=1e-6)
        assert not b.xyz[~b.valid].any()
    assert not np.allclose(b.xyz[b.valid], a.xyz[a.valid])  # it did smooth


def test_a_file_is_smoothed_on_its_media_clock_whatever_the_decode_speed(models: dict) -> None:
    """The same file decoded 1 ms or 50 ms per frame gives the same smoothed 2D and 3D keypoints (its pts say
    the frames are 1/30 s apart); a live source's frames are smoothed on their capture times."""
    def run(gap_ns: int, live: bool) -> list:
        engine = _engine(models, ("pose", "pointmap"), keypoints3d=Lift(threshold=0.0), smoother=KeypointSmoother())
        out = []
        for i, f in enumerate(_frames(3)):
            image = f.image if i % 2 == 0 else np.ascontiguousarray(f.image[::-1])
            frame = Frame(i, image, i, Fraction(1, 30), 10**18 + i * gap_ns, live=live)
            out.append(engine.finish(engine.submit(frame), False))
        return out

    fast, slow = run(1_000_000, False), run(50_000_000, False)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a.keypoints.xy, b.keypoints.xy)
        np.testing.assert_array_equal(a.keypoints3d.xyz, b.keypoints3d.xyz)
    live_fast, live_slow = run(1_000_000, True), run(50_000_000, True)
    assert not np.allclose(live_fast[-1].keypoints.xy, live_slow[-1].keypoints.xy)


# -- the CLI: published and written -------------------------------------------------------------
def test_cli_publishes_and_writes_the_same_3d_keypoints(tiny, cli_env: dict[str, str], tmp_path) -> None:
    import signal
    import socket
    import subprocess

    from sapiens2_client.subscriber import KeypointsMessage, ReceiveTimeout, Subscriber

    from tests.cliutil import CLI, OFFLINE, make_video, read_jsonl

    clip = make_video(tmp_path / "clip.mp4", n=900, w=160, h=120)  # 30 s paced: time enough for a slow joiner
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen([*CLI, "--source", str(clip), "--realtime", "--tasks", "pose,seg", "--keypoints3d",
                             "--keypoints3d-window", "3", "--save-keypoints", "k.jsonl", "--publish", endpoint,
                             *OFFLINE], env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    got: list[KeypointsMessage] = []
    try:
        with Subscriber(endpoint, ["keypoints"]) as sub:
            deadline = time.monotonic() + 150
            while len(got) < 3 and time.monotonic() < deadline:
                try:
                    msg = sub.recv(timeout_s=1.0)
                except ReceiveTimeout:
                    assert proc.poll() is None, proc.communicate()[1]
                    continue
                got.append(msg)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert len(got) >= 3, err
    lines = {r["frame"]: r for r in read_jsonl(tmp_path / "k.jsonl") if "frame" in r}
    for msg in got:
        k3 = msg.keypoints3d
        assert k3 is not None and k3.xyz.shape == (1, 308, 3) and k3.metric is True  # tiny has the scale branch
        assert k3.valid.any() and not k3.xyz[~k3.valid].any()
        record = lines[msg.meta.frame_index]
        assert record["keypoints3d_metric"] is True
        person = record["persons"][0]
        assert len(person["keypoints3d"]) == 308
        for point, xyz, ok in zip(person["keypoints3d"], k3.xyz[0].tolist(), k3.valid[0].tolist()):
            assert (point is None) == (not ok)
            if ok:
                np.testing.assert_allclose(point, xyz, atol=6e-5)
        root = person["root3d"]
        assert (root is None) == (not k3.root_valid[0])
        if root is not None:
            np.testing.assert_allclose(root, k3.root[0], atol=6e-5)
