"""Motion capture from the command line, as real subprocesses: three synthetic camera files through
the whole pipeline (tiny random weights) publishing world messages and writing the world JSONL and
TRC; ``triangulate`` recovering known skeletons from recorded keypoint files; ``export-world``;
and the refusals before any model loads."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pipeline.mocap.synthetic.people import base_skeleton, observe, pose_at, ring_rig
from sapiens2_client.jsonl import LineWriter, keypoint_record
from sapiens2_client.subscriber import ReceiveTimeout, Subscriber
from stages.metadata import load_metadata
from stages.mocap.camera import Camera, Rig, read_rig, write_rig
from tests.cliutil import CLI, OFFLINE, assert_one_clear_error, make_video, read_jsonl, run_cli

pytestmark = pytest.mark.timeout(300)
CAMERAS = ["cam1", "cam2", "cam3"]
FPS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _calibrated_at(camera: Camera, size: tuple[int, int]) -> Camera:
    """The camera as a calibration made at ``size`` has it (the matrix scaled about the pixel
    centres), built here rather than by ``Camera.rescaled``: the tests of the size check must fail
    on the check itself on code that has neither."""
    sx, sy = size[0] / camera.size[0], size[1] / camera.size[1]
    k = camera.matrix.copy()
    k[0] = [k[0, 0] * sx, k[0, 1] * sx, (k[0, 2] + 0.5) * sx - 0.5]
    k[1, 1:] = [k[1, 1] * sy, (k[1, 2] + 0.5) * sy - 0.5]
    return Camera(camera.name, size, k, camera.dist, camera.rvec, camera.tvec, camera.fisheye)


@pytest.fixture(scope="module")
def rig_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rig")
    rig = ring_rig(3, size=(320, 240), names=CAMERAS)
    write_rig(rig, folder / "calib.toml")
    for w, h in ((640, 480), (320, 180)):  # calibrated at twice the videos' size; at another aspect
        write_rig(Rig({n: _calibrated_at(c, (w, h)) for n, c in rig.cameras.items()}), folder / f"calib_{w}x{h}.toml")
    for i, name in enumerate(CAMERAS):
        make_video(folder / f"{name}.mp4", 6 + i)  # files of 6, 7 and 8 frames: the short ones end first
    return folder


def read_trc(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    """(the five header lines split at tabs, the data rows split at tabs); asserts the layout."""
    lines = path.read_text(encoding="ascii").split("\n")
    assert lines[0].startswith("PathFileType\t4\t(X/Y/Z)\t"), lines[0]
    assert lines[1].split("\t") == ["DataRate", "CameraRate", "NumFrames", "NumMarkers", "Units", "OrigDataRate",
                                    "OrigDataStartFrame", "OrigNumFrames"]
    assert lines[5] == "", "an empty line ends the header"
    header = [line.split("\t") for line in lines[:5]]
    rows = [line.split("\t") for line in lines[6:] if line]
    return header, rows


def _check_trc(path: Path, steps: int) -> list[list[str]]:
    header, rows = read_trc(path)
    names = [str(n) for n in load_metadata().keypoint_names]
    rate, camera_rate, frames, markers, units = header[2][:5]
    assert int(frames) == steps == len(rows) and int(markers) == len(names) and units == "m"
    assert math.isclose(float(rate), FPS, rel_tol=0.01) and math.isclose(float(camera_rate), FPS, rel_tol=0.01)
    assert header[3][:2] == ["Frame#", "Time"] and header[3][2::3] == names
    assert header[4][2:5] == ["X1", "Y1", "Z1"] and header[4][-3:] == [f"X{len(names)}", f"Y{len(names)}",
                                                                      f"Z{len(names)}"]
    for i, row in enumerate(rows, start=1):
        assert len(row) == 2 + 3 * len(names) and int(row[0]) == i
        assert math.isclose(float(row[1]), (i - 1) / FPS, abs_tol=1e-4)
        assert all(v == "" or math.isfinite(float(v)) for v in row[2:])
    return rows


def test_three_cameras_through_the_pipeline_publish_world_messages_and_write_world_files(
        tiny: Path, cli_env: dict[str, str], rig_dir: Path, tmp_path: Path) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    # Random weights give arbitrary keypoints: generous thresholds let them triangulate, so the files
    # and messages carry points (their accuracy is tests/stages/mocap/test_mocap.py's and the triangulate test's).
    args = [*OFFLINE, "--tasks", "pose", *(a for n in CAMERAS for a in ("--source", f"{n}={rig_dir / n}.mp4")),
            "--calibration", rig_dir / "calib_640x480.toml", "--rescale-calibration", "--triangulate",
            "--save-world", "out/world.jsonl",
            "--export-trc", "out/run.trc", "--save-keypoints", "out/{source}.jsonl", "--publish", endpoint,
            "--world-max-epipolar-px", "1e6", "--world-max-error-px", "1e6", "--world-max-uncertainty-mm", "1e9"]
    proc = subprocess.Popen([*CLI, *map(str, args)], env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    got = []
    try:
        with Subscriber(endpoint, ["world"]) as sub:
            deadline = time.monotonic() + 200  # connected while the models load: no step is missed
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    got.append(sub.recv(timeout_s=0.5))
                except ReceiveTimeout:
                    continue
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "camera cam1 calibrated at 640x480, scaled to the 320x240 of its frames" in err, err
    world = read_jsonl(tmp_path / "out" / "world.jsonl")
    assert world and [r["step"] for r in world] == list(range(len(world)))
    by_step = {r["step"]: r for r in world}
    assert got, f"no world message reached the subscriber\n{err}"
    for msg in got:
        assert type(msg).__name__ == "WorldMessage" and msg.topic == "world.rig" and msg.units == "m"
        assert msg.cameras == CAMERAS and msg.meta.random_weights
        record = by_step[msg.meta.frame_index]  # the message and the file line of one step agree
        assert msg.camera_frames == record["cameras"]
        assert msg.world_ids.tolist() == [p["id"] for p in record["persons"]]
        for p, person in enumerate(record["persons"]):
            points = np.array([[0.0] * 3 if v is None else v for v in person["keypoints"]])
            valid = np.array([v is not None for v in person["keypoints"]])
            assert (msg.world_valid[p] == valid).all()
            np.testing.assert_allclose(msg.world_keypoints[p][valid], points[valid], atol=1e-4)
            assert (msg.world_keypoints[p][~valid] == 0).all()
            assert msg.members_of(p) == person["members"]
    # each step fused the next frame of each camera still running (files of 6, 7 and 8 frames); the
    # persons' members point at the persons of those frames' keypoint lines
    assert [r["cameras"] for r in world] == [{n: i for j, n in enumerate(CAMERAS) if i < 6 + j} for i in range(8)]
    keypoints = {n: {r["frame"]: r for r in read_jsonl(tmp_path / "out" / f"{n}.jsonl")} for n in CAMERAS}
    for record in world:
        assert record["random_weights"] is True and record["units"] == "m"
        for person in record["persons"]:
            assert len(person["keypoints"]) == 308 and len(person["members"]) >= 2
            for camera, index in person["members"].items():
                assert index < len(keypoints[camera][record["cameras"][camera]]["persons"])
    assert any(p["keypoints"].count(None) < 308 for r in world for p in r["persons"]), "nothing triangulated"
    steps = len(world)
    trcs = sorted((tmp_path / "out").glob("run*.trc"))
    assert trcs, err
    for trc in trcs:
        _check_trc(trc, steps)
    assert not list((tmp_path / "out").glob("*.part")), "a spool or partial file was left"


def test_a_run_whose_trc_export_has_no_person_says_so(tiny: Path, cli_env: dict[str, str], rig_dir: Path,
                                                     tmp_path: Path) -> None:
    """--export-trc of a run where no person is triangulated (no pairing passes a 0.001 px epipolar
    test): no TRC file, one warning line that says why; the run succeeds."""
    args = [*OFFLINE, "--tasks", "pose", *(a for n in CAMERAS[:2] for a in ("--source", f"{n}={rig_dir / n}.mp4")),
            "--calibration", rig_dir / "calib.toml", "--triangulate", "--world-max-epipolar-px", "0.001",
            "--export-trc", "out/run.trc"]
    ran = run_cli(args, cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if "--export-trc" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING"), ran.stderr
    assert "--export-trc out/run.trc: no person was triangulated in the 7 world steps: no TRC written" in warnings[0]
    assert not list(tmp_path.rglob("*.trc")) and not list(tmp_path.rglob("*.part"))


def _recorded_run(folder: Path, steps: int = 12, miss: float = 0.05, hidden: tuple[int, int, int] | None = None,
                  persons: int = 2) -> tuple[list[list[np.ndarray]], Path]:
    """Keypoint files of three calibrated cameras watching known moving skeletons (two unless
    ``persons``; as the pipeline's --save-keypoints writes them), with a wrong detection in cam2;
    returns the truth. ``hidden``: (step, person, keypoint) that cam2 and cam3 miss."""
    rig = ring_rig(3, radius=3.5, names=CAMERAS)
    write_rig(rig, folder / "calib.toml")
    bases = [base_skeleton(j) for j in range(persons)]
    rng = np.random.default_rng(11)
    writers = {n: LineWriter(folder / f"{n}.jsonl") for n in CAMERAS}
    truth = []
    for i in range(steps):
        people = [pose_at(b, i / FPS, start=(-0.5 + j, 0.2 * j), heading=2.0 * j) for j, b in enumerate(bases)]
        truth.append(people)
        for name, (det, kp) in observe(rig, people, rng, noise_px=1.0, miss=miss).items():
            xy, scores, boxes, ids = kp.xy, kp.scores, det.boxes, det.track_ids
            if hidden is not None and hidden[0] == i and name != "cam1":
                scores = scores.copy()
                scores[np.flatnonzero(ids == hidden[1])[0], hidden[2]] = 0.0
            if name == "cam2":  # a false person only cam2 reports
                xy = np.concatenate([xy, xy[:1] + rng.normal(0, 40, xy[:1].shape) + 120])
                scores, boxes, ids = (np.concatenate([scores, scores[:1]]), np.concatenate([boxes, boxes[:1]]),
                                      np.append(ids, 9))
            writers[name].write(keypoint_record(frame=i, pts=i * 512, time_base=Fraction(1, 15360), capture_ns=1_700_000_000_000_000_000 + i, width=1280, height=720, random_weights=False,
                boxes=boxes, box_scores=np.full(len(boxes), 0.9), track_ids=ids, keypoints=xy, scores=scores))
    for writer in writers.values():
        writer.close()
    return truth, folder / "calib.toml"


def test_triangulate_recovers_known_skeletons_from_recorded_keypoint_files(cli_env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    truth, calib = _recorded_run(tmp_path)
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", calib, "--save-world", "world.jsonl", "--export-trc", "run_{person}.trc",
                   "--csv", "run.csv", "--npz", "run.npz"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert "12 steps from 3 cameras, 24 world persons" in ran.stdout, ran.stdout
    world = read_jsonl(tmp_path / "world.jsonl")
    assert len(world) == 12
    # each export says what it wrote
    for pid in {p["id"] for r in world for p in r["persons"]}:
        assert f"wrote run_{pid}.trc (TRC: person {pid}, 12 steps of 308 markers at 30.00 Hz, metres, Y up)" \
            in ran.stdout, ran.stdout
    assert "wrote run.csv (CSV: 24 rows, one per step and person: 12 steps, 2 persons;" in ran.stdout, ran.stdout
    assert "wrote run.npz (NumPy: xyz of 12 steps x 2 persons x 308 keypoints in metres" in ran.stdout, ran.stdout
    assert "wrote world.jsonl (world JSON Lines: 12 steps)" in ran.stdout, ran.stdout
    errors, who = [], {}
    for record, people in zip(world, truth):
        assert len(record["persons"]) == 2 and len(record["single_view"]) == 1  # the false person, alone
        assert record["single_view"][0]["camera"] == "cam2"
        for person in record["persons"]:
            points = [(np.array(v), i) for i, v in enumerate(person["keypoints"]) if v is not None]
            dist = [np.median([np.linalg.norm(p - x[i]) for p, i in points]) for x in people]
            j = int(np.argmin(dist))
            assert who.setdefault(person["id"], j) == j, "a world id changed person"
            errors.append(dist[j])
            assert len(points) > 0.9 * 308
    assert max(errors) < 0.006, f"median errors per person up to {1000 * max(errors):.1f} mm"
    # TRC per person, Y up (OpenSim): X, Y, Z of the file are the world's Y, Z, X
    pid = world[0]["persons"][0]["id"]
    rows = _check_trc(tmp_path / f"run_{pid}.trc", 12)
    nose = world[0]["persons"][0]["keypoints"][0]
    assert [float(v) for v in rows[0][2:5]] == pytest.approx([nose[1], nose[2], nose[0]], abs=1e-4)
    csv = (tmp_path / "run.csv").read_text().splitlines()
    assert csv[0].startswith("step,time_s,person,nose_x,nose_y,nose_z,") and len(csv) == 1 + 24
    first = csv[1].split(",")
    assert [float(v) for v in first[3:6]] == pytest.approx(nose, abs=1e-4)
    arrays = np.load(tmp_path / "run.npz")
    assert arrays["xyz"].shape == (12, 2, 308, 3) and arrays["valid"].mean() > 0.9
    assert np.isnan(arrays["xyz"][~arrays["valid"]]).all() and np.isfinite(arrays["xyz"][arrays["valid"]]).all()


def _median_errors(world: list[dict], truth: list[list[np.ndarray]]) -> list[float]:
    """Each world person's median error (m) against the nearest true person, step by step."""
    errors = []
    for record, people in zip(world, truth):
        for person in record["persons"]:
            points = [(np.array(v), i) for i, v in enumerate(person["keypoints"]) if v is not None]
            errors.append(min(np.median([np.linalg.norm(p - x[i]) for p, i in points]) for x in people))
    return errors


def test_triangulate_checks_the_calibration_against_the_keypoint_files_image_size(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    """Keypoint files of 1280x720 images: a calibration made at 640x360 is refused in one line naming
    the camera and both sizes; with --rescale-calibration it is scaled and recovers the skeletons as
    the right one does; one made at 640x480 (another aspect: a crop) is refused even so."""
    truth, calib = _recorded_run(tmp_path, steps=4)
    rig = read_rig(calib)
    for w, h in ((640, 360), (640, 480)):
        write_rig(Rig({n: _calibrated_at(c, (w, h)) for n, c in rig.cameras.items()}), tmp_path / f"calib_{w}x{h}.toml")
    keypoints = [a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")]
    ran = run_cli(["triangulate", *keypoints, "--calibration", "calib_640x360.toml", "--save-world", "w.jsonl"],
                  cli_env, tmp_path)
    refusal = assert_one_clear_error(ran, "calib_640x360.toml", "'cam1'", "calibrated at 640x360",
                                     "its keypoint file's images are 1280x720", "--rescale-calibration",
                                     "if they are its 640x360 view resized", "scale the calibration to 1280x720")
    assert "frames" not in refusal, "the refusal is about keypoint files, not frames"
    assert not (tmp_path / "w.jsonl").exists()
    ran = run_cli(["triangulate", *keypoints, "--calibration", "calib_640x480.toml", "--rescale-calibration",
                   "--save-world", "w.jsonl"], cli_env, tmp_path)
    assert_one_clear_error(ran, "'cam1'", "calibrated at 640x480", "images are 1280x720", "aspect")
    ran = run_cli(["triangulate", *keypoints, "--calibration", "calib_640x360.toml", "--rescale-calibration",
                   "--save-world", "w.jsonl"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    errors = _median_errors(read_jsonl(tmp_path / "w.jsonl"), truth)
    assert len(errors) == 8 and max(errors) < 0.006, f"median errors per person up to {1000 * max(errors):.1f} mm"


def test_triangulate_says_in_one_line_which_keypoint_file_gives_no_image_size_to_check(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    """Keypoint files of another tool (or of before they carried one) give no width and height: the
    calibration's size cannot be checked against them. triangulate says so in one warning line that
    names the file, the camera and the size it was calibrated at, and goes on; the other cameras'
    files are checked, and say nothing."""
    _recorded_run(tmp_path, steps=3)
    path = tmp_path / "cam2.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("width", "height")}) + "\n"
                            for r in records))
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", "calib.toml", "--save-world", "world.jsonl"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, ran.stderr
    for needle in (str(path), "'cam2'", "no image size", "made at 1280x720", "without checking"):
        assert needle in warnings[0], f"{needle!r} not in {warnings[0]!r}"
    assert "3 steps from 3 cameras, 6 world persons" in ran.stdout, ran.stdout


def test_the_trc_of_a_take_of_one_person_is_the_file_named(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/MOCAP.md, TRC, Naming: ``--export-trc run.trc`` of a take of one person writes run.trc
    itself (``run_P<id>.trc`` are for several), in triangulate and in export-world alike."""
    _recorded_run(tmp_path, steps=4, persons=1)
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", "calib.toml", "--save-world", "world.jsonl", "--export-trc", "run.trc"],
                  cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    world = read_jsonl(tmp_path / "world.jsonl")
    ids = {p["id"] for r in world for p in r["persons"]}
    assert len(ids) == 1, ids
    assert sorted(p.name for p in tmp_path.glob("*.trc")) == ["run.trc"]
    assert f"wrote run.trc (TRC: person {ids.pop()}, 4 steps of 308 markers" in ran.stdout, ran.stdout
    _check_trc(tmp_path / "run.trc", 4)
    ran = run_cli(["export-world", "world.jsonl", "--trc", "again.trc"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert sorted(p.name for p in tmp_path.glob("*.trc")) == ["again.trc", "run.trc"]


def test_exports_of_no_person_say_so_in_one_warning_line_each(cli_env: dict[str, str], tmp_path: Path) -> None:
    """No person is triangulated (no pairing passes a 0.001 px epipolar test): the TRC export writes
    nothing and says so; the CSV and NumPy files are written without a person, and say so; one
    warning line each. export-world of that world file says the same."""
    _recorded_run(tmp_path, steps=3)
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", "calib.toml", "--max-epipolar-px", "0.001", "--save-world", "world.jsonl",
                   "--export-trc", "run.trc", "--csv", "run.csv", "--npz", "run.npz"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert "3 steps from 3 cameras, 0 world persons in all, 0% of their keypoints triangulated" in ran.stdout
    warnings = [line for line in ran.stderr.splitlines() if "no person was triangulated" in line]
    assert len(warnings) == 3 and all(line.startswith("WARNING") for line in warnings), ran.stderr
    assert "in the 3 world steps: no TRC written" in warnings[0]
    assert "run.csv holds no person (CSV)" in warnings[1] and "run.npz holds no person (NumPy)" in warnings[2]
    assert not list(tmp_path.glob("run*.trc"))
    assert "wrote run.csv (CSV: 0 rows" in ran.stdout and "wrote run.npz (NumPy: xyz of 3 steps x 0 persons" in \
        ran.stdout, ran.stdout
    ran = run_cli(["export-world", "world.jsonl", "--trc", "again.trc"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if line.strip()] == [
        "WARNING pipeline.mocap.commands: no person was triangulated in the 3 world steps: no TRC written"]
    assert ran.stdout == "" and not list(tmp_path.glob("again*.trc"))


def test_the_summary_never_rounds_a_shortfall_up_to_all(cli_env: dict[str, str], tmp_path: Path) -> None:
    """One keypoint of 7,392 seen by one camera only (no other miss): 99.99% triangulated is not 100%."""
    _recorded_run(tmp_path, miss=0.0, hidden=(5, 0, 100))
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", "calib.toml", "--save-world", "world.jsonl"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    world = read_jsonl(tmp_path / "world.jsonl")
    assert sum(p["keypoints"].count(None) for r in world for p in r["persons"]) == 1
    assert "24 world persons in all, 99.9% of their keypoints triangulated" in ran.stdout, ran.stdout


def test_export_world_reads_a_file_cut_short_by_a_killed_run(cli_env: dict[str, str], tmp_path: Path) -> None:
    _recorded_run(tmp_path, steps=4)
    ran = run_cli(["triangulate", *(a for n in CAMERAS for a in ("--keypoints", f"{n}={tmp_path / n}.jsonl")),
                   "--calibration", tmp_path / "calib.toml", "--save-world", "world.jsonl"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    data = (tmp_path / "world.jsonl").read_bytes()
    (tmp_path / "cut.jsonl").write_bytes(data[: len(data) - 500])  # the last line torn, as by a SIGKILL
    ran = run_cli(["export-world", "cut.jsonl", "--trc", "cut.trc"], cli_env, tmp_path)
    assert ran.rc == 0, ran.stderr
    paths = sorted(tmp_path.glob("cut_P*.trc"))
    assert len(paths) == 2
    for path in paths:
        _check_trc(path, 3)


@pytest.mark.parametrize("extra, needles", [
    (["--triangulate"], ["--calibration"]),
    (["--triangulate", "--calibration", "missing.toml"], ["missing.toml", "does not exist"]),
    (["--triangulate", "--calibration", "{rig}/calib.toml", "--source", "door={rig}/cam1.mp4"], ["'door'", "cam1"]),
    (["--save-world", "w.jsonl"], ["--triangulate"]),
    (["--triangulate", "--calibration", "{rig}/calib.toml", "--tasks", "seg"], ["pose"]),
    (["--triangulate", "--calibration", "{rig}/calib_640x480.toml"],
     ["'cam1'", "calibrated at 640x480", "frames are 320x240", "--rescale-calibration"]),
    (["--triangulate", "--calibration", "{rig}/calib_320x180.toml", "--rescale-calibration"],
     ["'cam1'", "calibrated at 320x180", "frames are 320x240", "aspect"]),
])
def test_a_run_that_cannot_triangulate_is_refused_in_one_line_before_models_load(
        cli_env: dict[str, str], rig_dir: Path, tmp_path: Path, extra: list[str], needles: list[str]) -> None:
    sources = [a for n in CAMERAS[:2] for a in ("--source", f"{n}={rig_dir / n}.mp4")]
    args = [*OFFLINE, *sources, *(a.replace("{rig}", str(rig_dir)) for a in extra)]
    ran = run_cli(args, cli_env, tmp_path)
    assert_one_clear_error(ran, *needles)
    assert "loaded pose" not in ran.stderr, "a model loaded before the refusal"
