"""``calibrate`` on live cameras: two network streams (tests/livestream.py: H.264 in MPEG-TS over TCP,
served at 30 fps) show rendered board poses one after another, each held a second, unsynchronised
by up to a frame as real cameras are; the command takes one view per pose where the board stands
still in both, and Ctrl-C (a real SIGINT) ends the collection and calibrates."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from pipeline.mocap.synthetic.board import Renderer, board_poses, rig_cameras
from stages.mocap.camera import read_rig
from tests.cliutil import CLI, REPO, ctrl_c, killed_on_exit, wait_for
from tests.livestream import LiveStream, cycling
from tests.stages.mocap.test_calibration import BOARD

pytestmark = pytest.mark.timeout(300)
HOLD_S = 1.0  # each pose held this long: two still frames in each camera fit in it even on a loaded machine
POSES = 12


def _rgb(grey: np.ndarray) -> np.ndarray:
    return np.repeat(grey[..., None], 3, axis=2)


# The command started with SIGINT and SIGTERM ignored, as a background job of a non-interactive shell
# inherits SIGINT (a CI script's `... &`): it must still stop collecting on either (exec keeps the PID).
DEAF = ["sh", "-c", 'trap "" INT TERM; exec "$0" "$@"']


def test_calibrate_on_live_cameras_takes_still_views_and_ctrl_c_calibrates(tmp_path) -> None:
    cameras = rig_cameras()[:2]
    poses = board_poses(BOARD, POSES, seed=0)
    renderer = Renderer(BOARD)
    rng = np.random.default_rng(1)
    t0 = time.monotonic() + 1.0  # one clock for both: the same pose at the same moment, give or take a frame
    streams = [LiveStream(cycling([_rgb(renderer.render(c, p, rng)) for p in poses], HOLD_S), c.size, t0=t0)
               for c in cameras]
    out = tmp_path / "calib.toml"
    args = [arg for c, s in zip(cameras, streams) for arg in ("--source", f"{c.name}={s.url}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "stderr.txt"  # a file, read while it runs (a pipe would race communicate())
    with contextlib.ExitStack() as stack:
        for stream in streams:
            stack.enter_context(stream)
        proc = stack.enter_context(killed_on_exit(subprocess.Popen(
            [*DEAF, *CLI, "calibrate", *args, "--board", "6x8", "--square", "0.08", "--marker", "0.06", "--out",
             str(out)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stack.enter_context(open(log, "w")), text=True)))
        # More views than poses: the cycle came round, every pose a camera can see was offered.
        wait_for(lambda: proc.poll() is not None or f"\nview {POSES + 2} " in log.read_text(), f"view {POSES + 2}", 180)
        assert proc.poll() is None, log.read_text()
        stdout, _ = ctrl_c(proc)
    text = log.read_text()
    lines = text.splitlines()
    assert proc.returncode == 0, text
    assert "interrupted: stopped collecting after" in text and "Traceback" not in text, text
    views = [line for line in lines if line.startswith("view ")]
    frames = [int(line.split("(frame ")[1].split(")")[0]) for line in views]
    assert all(b > a for a, b in zip(frames, frames[1:])), views
    # One view per pose held: never two in a row of the same still board.
    assert len(views) <= POSES + 4, views
    rig = read_rig(out)
    for true in cameras:
        line = next(line for line in stdout.splitlines() if line.startswith(f"{true.name}: "))
        assert float(line.split("reprojection error ")[1].split(" px")[0]) < 0.6, line  # no torn view in it
        assert rig[true.name].matrix[0, 0] == pytest.approx(true.matrix[0, 0], rel=0.02)
    a, b = (rig[c.name] for c in cameras)
    ta, tb = cameras
    relative, true_relative = b.rotation @ a.rotation.T, tb.rotation @ ta.rotation.T
    angle = np.degrees(np.arccos(np.clip((np.trace(relative.T @ true_relative) - 1) / 2, -1, 1)))
    assert angle < 1.0, angle
    assert np.linalg.norm(a.centre - b.centre) == pytest.approx(np.linalg.norm(ta.centre - tb.centre), rel=0.02)


def test_sigterm_stops_a_live_collection_too(tmp_path) -> None:
    """SIGTERM ends the collection as Ctrl-C does; here no camera ever saw the board: one error line."""
    blank = np.full((120, 160, 3), 128, np.uint8)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "stderr.txt"
    with LiveStream(lambda t: blank, (160, 120)) as a, LiveStream(lambda t: blank, (160, 120)) as b, \
            open(log, "w") as err, killed_on_exit(subprocess.Popen(
                [*DEAF, *CLI, "calibrate", "--source", f"left={a.url}", "--source", f"right={b.url}", "--board",
                 "6x8", "--square", "0.08", "--marker", "0.06", "--out", str(tmp_path / "calib.toml")],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)) as proc:
        wait_for(lambda: proc.poll() is not None or "reading the cameras" in log.read_text(), "the collection", 120)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    text = log.read_text()
    assert proc.returncode == 1, text
    assert "terminated: stopped collecting after 0 views" in text, text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "found in no view" in errors[0] and "Traceback" not in text, text
    assert not (tmp_path / "calib.toml").exists()
