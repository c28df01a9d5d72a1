"""ChArUco calibration (stages/mocap/charuco.py, pipeline/mocap/calibrate.py) on board views
rendered through four cameras of known calibration (pipeline/mocap/synthetic/board.py): the recovered
intrinsics, poses and world frame, the rig file, the Pose2Sim and aniposelib files, the errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import tomllib

from pipeline.mocap.calibrate import main as calibrate_main
from pipeline.mocap.synthetic.board import BoardPose, Renderer, board_poses, rig_cameras
from stages.mocap.camera import CalibrationError, Camera, read_rig
from stages.mocap.charuco import Board, Detection, calibrate_rig, detect
from tests.cliutil import CLI, REPO, Ran, assert_one_clear_error

BOARD = Board(6, 8, 0.08, 0.06)  # 35 inner corners, 24 markers of DICT_4X4_50
VIEWS = 16
RIG_KEYS = {"name", "size", "matrix", "distortions", "rotation", "translation", "fisheye"}


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.degrees(np.arccos(np.clip((np.trace(a.T @ b) - 1) / 2, -1.0, 1.0))))


@pytest.fixture(scope="module")
def scene() -> dict:
    cameras = rig_cameras()
    poses = board_poses(BOARD, VIEWS, seed=0)
    renderer = Renderer(BOARD)
    rng = np.random.default_rng(1)
    images = {c.name: [renderer.render(c, pose, rng) for pose in poses] for c in cameras}
    detections = {name: [detect(BOARD, image) for image in views] for name, views in images.items()}
    return {"cameras": cameras, "poses": poses, "images": images, "detections": detections,
            "sizes": {c.name: c.size for c in cameras}}


@pytest.fixture(scope="module")
def calibrated(scene: dict):
    return calibrate_rig(BOARD, scene["detections"], scene["sizes"])


def test_scene_has_partial_views(scene: dict) -> None:
    """The rendered take is what the other tests claim: every camera sees most boards, and some
    views are seen by only some cameras."""
    seen = np.array([[len(d) >= 6 for d in scene["detections"][c.name]] for c in scene["cameras"]])  # (C, V)
    assert (seen.sum(axis=1) >= 12).all(), seen.sum(axis=1)
    partial = (seen.sum(axis=0) > 0) & (seen.sum(axis=0) < len(scene["cameras"]))
    assert partial.sum() >= 3, seen.astype(int)


def test_recovers_intrinsics(scene: dict, calibrated) -> None:
    for true in scene["cameras"]:
        got = calibrated.rig[true.name]
        assert got.size == true.size
        for i in (0, 1):
            assert got.matrix[i, i] == pytest.approx(true.matrix[i, i], rel=0.01), (true.name, got.matrix)
            assert abs(got.matrix[i, 2] - true.matrix[i, 2]) < 3.0, (true.name, got.matrix)
        assert calibrated.intrinsic_views[true.name] >= 12
        assert calibrated.intrinsic_error_px[true.name] < 0.5


def test_reprojection_error_under_half_a_pixel(scene: dict, calibrated) -> None:
    assert set(calibrated.error_px) == {c.name for c in scene["cameras"]}
    for name, error in calibrated.error_px.items():
        assert 0 < error < 0.5, (name, calibrated.error_px)
        assert calibrated.views[name] >= 10, calibrated.views


def test_recovers_relative_poses(scene: dict, calibrated) -> None:
    cameras = scene["cameras"]
    for a in cameras:
        for b in cameras:
            if a.name >= b.name:
                continue
            true_rel = b.rotation @ a.rotation.T
            got_rel = calibrated.rig[b.name].rotation @ calibrated.rig[a.name].rotation.T
            assert _angle_deg(true_rel, got_rel) < 0.5, (a.name, b.name)
            true_d = np.linalg.norm(b.centre - a.centre)
            got_d = np.linalg.norm(calibrated.rig[b.name].centre - calibrated.rig[a.name].centre)
            assert got_d == pytest.approx(true_d, rel=0.01), (a.name, b.name)


def test_world_is_the_first_board_of_the_reference_camera(scene: dict, calibrated) -> None:
    """Origin at the board's first corner in the first view cam0 saw, z out of the board toward the
    cameras, metres: each camera's pose is its true pose seen from that board."""
    first = next(v for v, d in enumerate(scene["detections"]["cam0"]) if len(d) >= 6)
    assert calibrated.world_view == first
    pose: BoardPose = scene["poses"][first]
    world_to_true = pose.rotation @ np.diag([1.0, -1.0, -1.0])  # our world -> the scene's world: y, z flipped
    origin = pose.rotation @ BOARD.corners[0] + pose.translation
    for true in scene["cameras"]:
        got = calibrated.rig[true.name]
        assert _angle_deg(true.rotation @ world_to_true, got.rotation) < 0.5, true.name
        expected_centre = world_to_true.T @ (true.centre - origin)
        assert np.linalg.norm(got.centre - expected_centre) < 0.01, (true.name, got.centre, expected_centre)
        assert got.centre[2] > 0.5  # in front of the board: z points toward the cameras


def test_cli_writes_a_rig_file_from_image_folders(scene: dict, tmp_path: Path) -> None:
    """The command as a real subprocess on PNG folders, one per camera, read in lockstep."""
    args = []
    for name, images in scene["images"].items():
        folder = tmp_path / name
        folder.mkdir()
        for i, image in enumerate(images):
            cv2.imwrite(str(folder / f"frame_{i:03d}.png"), image)
        args += ["--source", f"{name}={folder}"]
    out = tmp_path / "calib.toml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([*CLI, "calibrate", *args,
                           "--board", "6x8", "--square", "0.08", "--marker", "0.06", "--out", str(out)],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for camera in scene["cameras"]:
        line = next(line for line in lines if line.startswith(f"{camera.name}: "))
        error = float(line.split("reprojection error ")[1].split(" px")[0])
        assert 0 < error < 0.5, line
        assert " views" in line
    assert lines[-1] == f"wrote {out}"
    rig = read_rig(out)
    assert rig.names == [c.name for c in scene["cameras"]]
    for true in scene["cameras"]:
        assert rig[true.name].matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.01)
    doc = tomllib.loads(out.read_text())
    cams = [k for k in doc if k != "metadata"]
    assert cams == ["cam_01", "cam_02", "cam_03", "cam_04"]
    for key in cams:
        assert set(doc[key]) == RIG_KEYS, doc[key].keys()
        assert len(doc[key]["size"]) == 2 and np.shape(doc[key]["matrix"]) == (3, 3)
        assert len(doc[key]["rotation"]) == 3 and len(doc[key]["translation"]) == 3
        assert len(doc[key]["distortions"]) == 4 and doc[key]["fisheye"] is False
    assert doc["metadata"]["units"] == "m" and doc["metadata"]["adjusted"] is False
    assert doc["metadata"]["error"] == pytest.approx(max(doc["metadata"]["reprojection_error_px"].values()))

    # Never overwrite silently; a failed fit (too few views for --min-views) is one clear line.
    before = out.read_bytes()
    ran = _run_in_process([*args, "--board", "6x8", "--square", "0.08", "--marker", "0.06", "--out", str(out)])
    assert_one_clear_error(ran, "exists", "--overwrite")
    ran = _run_in_process([*args, "--board", "6x8", "--square", "0.08", "--marker", "0.06", "--out",
                           str(tmp_path / "new.toml"), "--max-views", "3"])
    assert_one_clear_error(ran, "too few views", "cam0")
    assert out.read_bytes() == before and not (tmp_path / "new.toml").exists()


def _run_in_process(argv: list[str]) -> Ran:
    import contextlib
    import io

    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        try:
            rc = calibrate_main(["calibrate", *argv])
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code
    # Only the command's own lines: library logging goes to pytest's handlers, not this stderr.
    return Ran(rc, stdout.getvalue(), err.getvalue(), 0.0)


@pytest.mark.parametrize("flags, needles", [
    (["--board", "5by7"], ["5by7", "COLUMNSxROWS"]),
    (["--board", "6x8", "--marker", "0.09"], ["marker", "smaller than the square"]),
    (["--board", "20x20"], ["200 markers", "larger dictionary"]),
    (["--source", "cam2=/no/such/video.mp4"], ["/no/such/video.mp4", "no such file"]),
    (["--dictionary", "DICT_9X9_1"], ["--dictionary", "'DICT_9X9_1'", "DICT_4X4_50"]),
])
def test_cli_bad_input_is_one_line(tmp_path: Path, flags: list[str], needles: list[str]) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.full((48, 64), 128, np.uint8))
    argv = ["--source", f"cam0={folder}", "--source", f"cam1={folder}", "--square", "0.08", "--marker", "0.06",
            "--out", str(tmp_path / "calib.toml")]
    if "--board" not in flags:
        argv += ["--board", "6x8"]
    if "--marker" in flags:
        argv.remove("--marker")
        argv.remove("0.06")
    ran = _run_in_process([*argv, *flags])
    assert_one_clear_error(ran, *needles)
    assert not (tmp_path / "calib.toml").exists()


def test_cli_no_board_in_any_view(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((48, 64), 128, np.uint8))
    ran = _run_in_process(["--source", f"left={folder}", "--source", f"right={folder}", "--board", "6x8",
                           "--square", "0.08", "--marker", "0.06", "--out", str(tmp_path / "calib.toml")])
    assert_one_clear_error(ran, "found in no view", "left")


def test_camera_with_too_few_views_is_named(scene: dict) -> None:
    detections = dict(scene["detections"])
    kept = [v for v, d in enumerate(detections["cam2"]) if len(d) >= 6][:3]
    detections["cam2"] = [d if v in kept else Detection.empty() for v, d in enumerate(detections["cam2"])]
    with pytest.raises(CalibrationError) as info:
        calibrate_rig(BOARD, detections, scene["sizes"])
    message = str(info.value)
    assert "'cam2'" in message and "3 view(s)" in message and "need 8" in message, message
    assert "'cam0'" not in message and "\n" not in message


def test_camera_never_sharing_a_view_is_named(scene: dict) -> None:
    """cam3 sees as many boards as ever, but never while another camera does."""
    detections = dict(scene["detections"])
    detections["cam3"] = [None] * VIEWS + list(detections["cam3"])  # its views come after the others'
    with pytest.raises(CalibrationError) as info:
        calibrate_rig(BOARD, detections, scene["sizes"])
    message = str(info.value)
    assert "'cam3'" in message and "not connected" in message and "at the same time" in message, message
    assert "\n" not in message


def test_board_seen_nowhere(scene: dict) -> None:
    blank = {name: [Detection.empty()] * VIEWS for name in scene["detections"]}
    with pytest.raises(CalibrationError, match="found in no view of cam0, cam1, cam2, cam3"):
        calibrate_rig(BOARD, blank, scene["sizes"])


# -- the other tools' files, as those tools write them -------------------------------------------
def _rows(values) -> str:
    return "[ " + ", ".join(f"{float(v)!r}" for v in values) + ",]"  # Python's toml writes a trailing comma


def _pose2sim(cameras: list[Camera]) -> str:
    text = ""
    for i, c in enumerate(cameras, start=1):
        text += (f"[cam_{i:02d}]\nname = \"{c.name}\"\nsize = {_rows(c.size)}\n"
                 f"matrix = [ {', '.join(_rows(row) for row in c.matrix)},]\n"
                 f"distortions = {_rows(c.dist[:4])}\nrotation = {_rows(c.rvec)}\n"
                 f"translation = {_rows(c.tvec)}\nfisheye = false\n\n")
    return text + "[metadata]\nadjusted = false\nerror = 0.0\n"


def test_reads_a_pose2sim_file_as_is(scene: dict, tmp_path: Path) -> None:
    path = tmp_path / "Calib_board.toml"
    path.write_text(_pose2sim(scene["cameras"]))
    rig = read_rig(path)
    assert rig.names == [c.name for c in scene["cameras"]]
    for true in scene["cameras"]:
        assert rig[true.name].size == true.size and rig[true.name].dist.size == 4
        np.testing.assert_allclose(rig[true.name].matrix, true.matrix)
        np.testing.assert_allclose(rig[true.name].centre, true.centre, atol=1e-9)


def test_reads_an_aniposelib_file_as_is(tmp_path: Path) -> None:
    path = tmp_path / "calibration.toml"
    path.write_text(
        '[cam_0]\nname = "A"\nsize = [ 1280, 1024,]\n'
        "matrix = [ [ 1100.5, 0.0, 640.2,], [ 0.0, 1101.0, 511.8,], [ 0.0, 0.0, 1.0,],]\n"
        "distortions = [ -0.21, 0.12, 0.001, -0.0004, -0.03,]\n"
        "rotation = [ 0.0, 0.0, 0.0,]\ntranslation = [ 0.0, 0.0, 0.0,]\n\n"
        '[cam_1]\nname = "B"\nsize = [ 1280, 1024,]\n'
        "matrix = [ [ 1090.0, 0.0, 650.0,], [ 0.0, 1090.0, 500.0,], [ 0.0, 0.0, 1.0,],]\n"
        "distortions = [ -0.2, 0.1, 0.0, 0.0, 0.0,]\n"
        "rotation = [ 0.1, -0.6, 0.05,]\ntranslation = [ 1.2, 0.05, 0.3,]\n\n"
        "[metadata]\nadjusted = true\nerror = 0.52\n")
    rig = read_rig(path)
    assert rig.names == ["A", "B"]
    assert rig["A"].size == (1280, 1024) and rig["A"].dist.size == 5
    assert rig["B"].matrix[0, 2] == 650.0 and rig["B"].tvec.tolist() == [1.2, 0.05, 0.3]


def test_extrinsics_only_with_intrinsics_from_a_pose2sim_file(scene: dict, tmp_path: Path) -> None:
    """The true intrinsics, from a Pose2Sim file, are kept exactly; only the poses are fitted."""
    path = tmp_path / "Calib_intrinsics.toml"
    path.write_text(_pose2sim(scene["cameras"]))
    given = read_rig(path)
    result = calibrate_rig(BOARD, scene["detections"], scene["sizes"], intrinsics=given.cameras)
    for true in scene["cameras"]:
        got = result.rig[true.name]
        np.testing.assert_array_equal(got.matrix, true.matrix)
        np.testing.assert_array_equal(got.dist, true.dist[:4])
        assert result.intrinsic_error_px[true.name] is None and result.error_px[true.name] < 0.5
    a, b = scene["cameras"][0], scene["cameras"][2]
    true_d = np.linalg.norm(b.centre - a.centre)
    assert np.linalg.norm(result.rig[b.name].centre - result.rig[a.name].centre) == pytest.approx(true_d, rel=0.005)


def test_refined_intrinsics_stay_true(scene: dict, calibrated) -> None:
    """With the intrinsics refined jointly, the fit stays as close to the truth and no worse in pixels."""
    result = calibrate_rig(BOARD, scene["detections"], scene["sizes"], refine_intrinsics=True)
    for true in scene["cameras"]:
        got = result.rig[true.name]
        assert got.matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.01)
        assert abs(got.matrix[0, 2] - true.matrix[0, 2]) < 3.0 and abs(got.matrix[1, 2] - true.matrix[1, 2]) < 3.0
        assert result.error_px[true.name] <= calibrated.error_px[true.name] + 1e-6
        assert not np.array_equal(got.matrix, calibrated.rig[true.name].matrix)  # they did move
