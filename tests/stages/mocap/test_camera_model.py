"""The camera model's fast paths against the plain ones: the world step's undistortion table
(undistort.UndistortGrid) against OpenCV's iteration, a CameraSet's batched projection against each
camera's own, and the chunked normal equations of the triangulation against per-point least squares."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mocap.synthetic.people import horizontal_fov_matrix, look_at, ring_rig
from stages.mocap.camera import Camera, CameraSet
from stages.mocap.dlt import normal_blocks, solve_dlt
from stages.mocap.undistort import GridSet, UndistortGrid


def _camera(size=(1920, 1080), dist=(-0.12, 0.05, 0.0005, -0.0004, 0.0), fisheye=False, name="c") -> Camera:
    rvec, tvec = look_at((3.0, 1.0, 1.8), (0, 0, 1.0))
    k = horizontal_fov_matrix(*size, 70.0)
    k[0, 2] += 9.0
    return Camera(name, size, k, np.array(dist, float), rvec, tvec, fisheye)


def _pixels(camera: Camera, n: int, margin: float, seed: int = 0) -> np.ndarray:
    w, h = camera.size
    return np.random.default_rng(seed).uniform([-margin, -margin], [w + margin, h + margin], (n, 2))


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_the_table_undistorts_as_opencv_does_on_and_off_the_frame(size) -> None:
    camera = _camera(size)
    grid = UndistortGrid(camera)
    assert grid.usable and grid.step == 8 and grid.error_px <= 0.01
    focal = camera.matrix[0, 0]
    inside = _pixels(camera, 5000, 10.0)  # the frame and the table's margin
    got = grid(inside.reshape(50, 100, 2))
    assert got.shape == (50, 100, 2) and got.dtype == np.float64
    assert np.abs(got.reshape(-1, 2) - camera.undistort(inside)).max() * focal < 0.01
    # Off the table (far outside the frame), not finite: OpenCV's own answer, exactly.
    far = np.array([[-400.0, 30.0], [size[0] + 500.0, size[1] / 2], [10.0, -900.0], [np.nan, 5.0], [3.0, np.inf]])
    mixed = np.concatenate([inside[:7], far])
    out, want = grid(mixed), camera.undistort(mixed)
    np.testing.assert_array_equal(out[7:], want[7:])  # (NaN where OpenCV gives NaN)
    assert np.abs(out[:7] - want[:7]).max() * focal < 0.01
    assert grid(np.zeros((0, 2))).shape == (0, 2)


def test_a_lens_the_table_cannot_follow_and_a_fisheye_keep_opencv() -> None:
    strong = _camera((1280, 720), dist=(-0.3, 0.1, 0.001, 0.001, -0.02))
    grid = UndistortGrid(strong)
    assert not grid.usable and grid.error_px > 0.01  # the finest step tried is 4 px: 0.02 px off here
    points = _pixels(strong, 500, 0.0)
    np.testing.assert_array_equal(grid(points), strong.undistort(points))
    fisheye = _camera((1280, 720), dist=(0.05, -0.01, 0.002, 0.0), fisheye=True)
    grid = UndistortGrid(fisheye)
    assert not grid.usable
    np.testing.assert_array_equal(grid(points), fisheye.undistort(points))


def test_a_grid_set_looks_up_every_camera_as_its_own_table_does() -> None:
    """The world step's one pass over all cameras: tables of two frame sizes (the smaller padded),
    a lens no table follows, points on the padding, off every table and not finite: each camera's
    keypoints come back exactly as its own table gives them."""
    cameras = [_camera((1280, 720), name="a"), _camera((1920, 1080), name="b"),
               _camera((1280, 720), dist=(-0.3, 0.1, 0.001, 0.001, -0.02), name="c"), _camera(name="d")]
    grids = [UndistortGrid(c) for c in cameras]
    batch = GridSet(grids)
    assert batch.batched == [0, 1, 3]
    pixels = [_pixels(c, 600, 30.0, seed=i).reshape(3, 200, 2).astype(np.float32) for i, c in enumerate(cameras)]
    pixels[0][0, :3] = [[1500.0, 100.0], [np.nan, 3.0], [-500.0, 10.0]]  # on the padding, not finite, off
    got = batch(pixels)
    assert len(got) == 4
    for grid, p, out in zip(grids, pixels, got):
        assert out.shape == p.shape and out.dtype == np.float64
        np.testing.assert_array_equal(out, grid(p))


def test_a_camera_set_projects_as_each_camera_does() -> None:
    """Pinhole cameras of 4, 5 and 8 coefficients batched; a fisheye and a thin-prism (12) one each
    through its own model."""
    cameras = [_camera(dist=(-0.1, 0.02, 0.001, 0.0), name="a"), _camera(name="b"),
               _camera(dist=(-0.1, 0.02, 0.001, 0.0, 0.01, 0.002, 0.001, 0.0005), name="c"),
               _camera(dist=(0.05, -0.01, 0.002, 0.0), fisheye=True, name="d"),
               _camera(dist=(-0.1, 0.02, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1e-3, 0.0, -1e-3, 0.0), name="e")]
    cameras += [c.with_pose(c.rvec + 0.1 * i, c.tvec) for i, c in enumerate(cameras)]
    points = np.random.default_rng(3).normal([0, 0, 1], [0.8, 0.8, 0.6], (700, 3))
    points[:5] = [[3.0, 1.0, 1.8], [6.0, 2.0, 2.6], [0, 0, 1], [1, 1, 1], [-2, 0, 0.5]]  # a centre, a point behind
    cams = CameraSet(cameras)
    assert cams.batched == [0, 1, 2, 5, 6, 7]
    pixels, front = cams.project(points)
    assert pixels.shape == (700, 10, 2) and front.shape == (700, 10)
    for i, camera in enumerate(cameras):
        want, want_front = camera.project(points)
        np.testing.assert_array_equal(front[:, i], want_front)
        np.testing.assert_allclose(pixels[front[:, i], i], want[want_front], rtol=0, atol=1e-6)


def _lstsq_dlt(extrinsics: np.ndarray, normalised: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """One point at a time: the weighted DLT's equations A [X, 1] = 0 solved for X by LAPACK's least
    squares (an SVD)."""
    out = []
    for xy, w in zip(normalised, weights):
        rows = []
        for e, (x, y), wc in zip(extrinsics, xy, w):
            rows += [wc * (x * e[2] - e[0]), wc * (y * e[2] - e[1])]
        a = np.array(rows)
        out.append(np.linalg.lstsq(a[:, :3], -a[:, 3], rcond=None)[0])
    return np.array(out)


def test_the_normal_equations_in_chunks_solve_as_per_point_least_squares() -> None:
    """8 cameras and 3,000 points: the product is made in chunks of 910 points (one thread each)."""
    rig = ring_rig(8, radius=3.5)
    cams = [rig[name] for name in rig.names]
    extrinsics = np.stack([c.extrinsic for c in cams])
    rng = np.random.default_rng(5)
    truth = rng.normal([0, 0, 1], [0.5, 0.5, 0.5], (3000, 3))
    camera_xyz = np.einsum("cij,nj->nci", extrinsics[:, :, :3], truth) + extrinsics[:, :, 3]
    normalised = camera_xyz[..., :2] / camera_xyz[..., 2:] + rng.normal(0, 1e-3, (3000, 8, 2))
    weights = rng.uniform(0.3, 1.0, (3000, 8))
    weights[rng.uniform(size=(3000, 8)) < 0.3] = 0.0  # views that do not count
    weights[:3, 2:] = 0.0  # two views only
    xyz, ok = solve_dlt(normal_blocks(extrinsics), normalised, weights)
    solvable = (weights > 0).sum(axis=1) >= 2
    assert ok[solvable].all()
    np.testing.assert_allclose(xyz[solvable], _lstsq_dlt(extrinsics, normalised, weights)[solvable], rtol=0, atol=1e-6)
    assert np.median(np.linalg.norm(xyz[solvable] - truth[solvable], axis=1)) < 0.02


def test_a_rescaled_camera_sees_the_world_in_its_resized_frame() -> None:
    """A camera calibrated at 1920x1080 and rescaled to 1280x720 projects every point where a resize of
    its frame puts it (pixel centres: x' = (x + 0.5) * 2/3 - 0.5), distortion and all; its undistortion
    inverts that projection."""
    full = _camera((1920, 1080))
    small = full.rescaled((1280, 720))
    assert small.size == (1280, 720) and np.array_equal(small.dist, full.dist)
    points = np.random.default_rng(3).uniform([-1.0, -1.0, 0.2], [1.0, 1.0, 1.8], (500, 3))
    big_px, front = full.project(points)
    small_px, _ = small.project(points)
    assert front.all()
    np.testing.assert_allclose(small_px, (big_px + 0.5) * (1280 / 1920) - 0.5, atol=1e-9)
    np.testing.assert_allclose(small.undistort(small_px), full.undistort(big_px), atol=1e-6)


def test_points_in_float32_project_as_in_float64_to_a_thousandth_of_a_pixel() -> None:
    """The world step checks its pixel errors in float32 (``CameraSet.project_each``): batched pinhole
    cameras and a fisheye one, each row projected into its own camera."""
    cameras = [_camera(name="a"), _camera((1280, 720), name="b").with_pose(np.array([0.1, -0.2, 0.3]),
                                                                         np.array([0.2, -0.1, 3.5])),
               _camera(dist=(0.05, -0.01, 0.002, 0.0), fisheye=True, name="c")]
    cams = CameraSet(cameras)
    points = np.ascontiguousarray(np.random.default_rng(5).normal([0, 0, 1], [0.8, 0.8, 0.6], (3, 400, 3))
                                  .transpose(0, 2, 1))  # (C, 3, N)
    u, v, front, _ = cams.project_each(points)
    u32, v32, front32, cam32 = cams.project_each(points.astype(np.float32))
    assert u32.dtype == v32.dtype == cam32.dtype == np.float32
    np.testing.assert_array_equal(front32, front)
    assert front.mean() > 0.9
    assert np.abs(u32 - u)[front].max() < 1e-3 and np.abs(v32 - v)[front].max() < 1e-3
