"""Calibration beyond the ordinary pinhole rig (pipeline/mocap/synthetic/board.py renders the views): fisheye lenses
(``calibrate --fisheye``), a mixed rig, and boards printed by OpenCV before 4.6 (``--legacy-board``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import tomllib

from pipeline.mocap.synthetic.board import Renderer, board_poses, fisheye_board_poses, fisheye_cameras, rig_cameras
from stages.mocap.camera import CalibrationError, read_rig
from stages.mocap.charuco import Board, calibrate_rig, detect
from tests.cliutil import CLI, REPO, assert_one_clear_error
from tests.stages.mocap.test_calibration import _run_in_process

FISH_BOARD = Board(5, 7, 0.05, 0.04)  # 24 inner corners; larger markers: a fisheye image is small
LEGACY_BOARD = Board(6, 8, 0.08, 0.06, legacy=True)  # an even number of rows: the legacy pattern differs


def _write_folders(images: dict[str, list[np.ndarray]], root: Path) -> list[str]:
    args = []
    for name, views in images.items():
        folder = root / name
        folder.mkdir()
        for i, image in enumerate(views):
            cv2.imwrite(str(folder / f"frame_{i:03d}.png"), image)
        args += ["--source", f"{name}={folder}"]
    return args


@pytest.fixture(scope="module")
def fish(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cameras = fisheye_cameras()
    poses = fisheye_board_poses(FISH_BOARD, cameras, shared=8, per_camera=10, seed=3)
    renderer = Renderer(FISH_BOARD, px_per_square=60)
    rng = np.random.default_rng(1)
    images = {c.name: [renderer.render(c, pose, rng) for pose in poses] for c in cameras}
    detections = {name: [detect(FISH_BOARD, image) for image in views] for name, views in images.items()}
    root = tmp_path_factory.mktemp("fisheye")
    return {"cameras": cameras, "images": images, "detections": detections, "root": root,
            "sizes": {c.name: c.size for c in cameras}, "args": _write_folders(images, root)}


def _board_flags(board: Board) -> list[str]:
    return ["--board", f"{board.squares_x}x{board.squares_y}", "--square", str(board.square_m),
            "--marker", str(board.marker_m)]


def _angles_deg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angles between rays (x, y, 1) of normalised coordinates (..., 2)."""
    ra = np.concatenate([a, np.ones_like(a[..., :1])], -1)
    rb = np.concatenate([b, np.ones_like(b[..., :1])], -1)
    cos = np.sum(ra * rb, -1) / np.linalg.norm(ra, axis=-1) / np.linalg.norm(rb, axis=-1)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def test_fisheye_cameras_are_calibrated_with_the_fisheye_model(fish: dict) -> None:
    """The command as a real subprocess: both cameras fitted as fisheyes, their focal lengths, principal
    points, the rays of the whole image out to 70 degrees off the axis and their relative pose recovered."""
    seen = {n: sum(len(d) >= 6 for d in ds) for n, ds in fish["detections"].items()}
    assert all(v >= 12 for v in seen.values()), seen  # the take is what this test claims
    out = fish["root"] / "calib.toml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([*CLI, "calibrate", *fish["args"], *_board_flags(FISH_BOARD), "--fisheye", "--out", str(out)],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for camera in fish["cameras"]:
        line = next(line for line in lines if line.startswith(f"{camera.name}: "))
        assert "fisheye intrinsics" in line, line
        assert 0 < float(line.split("reprojection error ")[1].split(" px")[0]) < 0.5, line
    doc = tomllib.loads(out.read_text())
    assert [doc[k]["fisheye"] for k in doc if k != "metadata"] == [True, True]
    assert [len(doc[k]["distortions"]) for k in doc if k != "metadata"] == [4, 4]
    rig = read_rig(out)
    for true in fish["cameras"]:
        got = rig[true.name]
        assert got.fisheye
        assert got.matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.01)
        assert got.matrix[1, 1] == pytest.approx(true.matrix[1, 1], rel=0.01)
        assert np.abs(got.matrix[:2, 2] - true.matrix[:2, 2]).max() < 3.0, (got.matrix, true.matrix)
        # The rays of the image out to 70 degrees: the lens as a whole, not only its coefficients.
        theta = np.radians(np.linspace(0, 70, 15))
        phi = np.linspace(0, 2 * np.pi, 24, endpoint=False)
        t, p = np.meshgrid(theta, phi)
        rays = np.stack([np.tan(t) * np.cos(p), np.tan(t) * np.sin(p)], -1)
        pixels = true.project(np.concatenate([rays, np.ones_like(rays[..., :1])], -1) @ true.rotation
                              + true.centre)[0]  # rays in the camera frame -> world -> the true image
        inside = (pixels >= 0).all(-1) & (pixels[..., 0] < true.size[0]) & (pixels[..., 1] < true.size[1])
        error = _angles_deg(got.undistort(pixels[inside]), rays[inside])
        assert error.max() < 0.5, (true.name, error.max())  # measured 0.21 and 0.26; a pinhole fit: 17 and 10
    a, b = (rig[c.name] for c in fish["cameras"])
    ta, tb = fish["cameras"]
    assert np.linalg.norm(a.centre - b.centre) == pytest.approx(np.linalg.norm(ta.centre - tb.centre), rel=0.02)
    relative, true_relative = b.rotation @ a.rotation.T, tb.rotation @ ta.rotation.T
    angle = np.degrees(np.arccos(np.clip((np.trace(relative.T @ true_relative) - 1) / 2, -1, 1)))
    assert angle < 0.5, angle


def test_a_pinhole_fit_of_a_fisheye_is_worse_and_a_mixed_rig_fits_each_its_own(fish: dict) -> None:
    """Why --fisheye exists: the pinhole model cannot follow the edges of these images (its error is
    at least twice the fisheye's); --fisheye NAME fits only the camera named."""
    fisheye = calibrate_rig(FISH_BOARD, fish["detections"], fish["sizes"], fisheye=["fish0", "fish1"])
    pinhole = calibrate_rig(FISH_BOARD, fish["detections"], fish["sizes"])
    for name in ("fish0", "fish1"):
        assert fisheye.rig[name].fisheye and not pinhole.rig[name].fisheye
        assert pinhole.intrinsic_error_px[name] > 2 * fisheye.intrinsic_error_px[name], (
            name, pinhole.intrinsic_error_px[name], fisheye.intrinsic_error_px[name])
    mixed = calibrate_rig(FISH_BOARD, fish["detections"], fish["sizes"], fisheye=["fish1"])
    assert not mixed.rig["fish0"].fisheye and mixed.rig["fish1"].fisheye
    assert mixed.intrinsic_error_px["fish1"] == pytest.approx(fisheye.intrinsic_error_px["fish1"])
    refined = calibrate_rig(FISH_BOARD, fish["detections"], fish["sizes"], fisheye=["fish0", "fish1"],
                            refine_intrinsics=True)  # the joint refinement moves fisheye intrinsics too
    for true in fish["cameras"]:
        assert refined.rig[true.name].fisheye and refined.error_px[true.name] < 0.5
        assert refined.rig[true.name].matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.01)
    with pytest.raises(CalibrationError, match="no camera 'fish7'"):
        calibrate_rig(FISH_BOARD, fish["detections"], fish["sizes"], fisheye=["fish7"])


@pytest.mark.parametrize("flags, needles", [
    (["--fisheye", "fish0,fish7"], ["--fisheye", "'fish7'", "fish0, fish1"]),
    (["--fisheye", "--intrinsics", "calib.toml"], ["--fisheye with --intrinsics", "lens model"]),
])
def test_fisheye_flag_refusals_are_one_line(fish: dict, tmp_path: Path, flags: list[str], needles: list[str]) -> None:
    flags = [str(tmp_path / f) if f.endswith(".toml") else f for f in flags]
    ran = _run_in_process([*fish["args"], *_board_flags(FISH_BOARD), *flags, "--out", str(tmp_path / "out.toml")])
    assert_one_clear_error(ran, *needles)
    assert not (tmp_path / "out.toml").exists()


def test_a_legacy_board_is_found_with_legacy_board_and_not_without(tmp_path: Path) -> None:
    """A board printed by OpenCV before 4.6 (even rows: its first square differs) is calibrated with
    --legacy-board; without it the board is found nowhere and the error says to check the pattern."""
    cameras = rig_cameras()[:2]
    poses = board_poses(LEGACY_BOARD, 12, seed=0)
    renderer = Renderer(LEGACY_BOARD)
    rng = np.random.default_rng(1)
    args = _write_folders({c.name: [renderer.render(c, pose, rng) for pose in poses] for c in cameras}, tmp_path)
    out = tmp_path / "calib.toml"
    ran = _run_in_process([*args, *_board_flags(LEGACY_BOARD), "--out", str(out)])
    assert_one_clear_error(ran, "found in no view", "legacy pattern")
    assert not out.exists()
    ran = _run_in_process([*args, *_board_flags(LEGACY_BOARD), "--legacy-board", "--out", str(out)])
    assert ran.rc == 0, ran.stderr
    rig = read_rig(out)
    assert "(legacy)" in rig.metadata["board"]
    for true in cameras:
        assert rig[true.name].matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.01)
        line = next(line for line in ran.stdout.splitlines() if line.startswith(f"{true.name}: "))
        assert float(line.split("reprojection error ")[1].split(" px")[0]) < 0.5, line
