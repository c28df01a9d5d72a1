"""The pipeline's ZeroMQ sink end to end: a CLI run publishes, a real subscriber on loopback decodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sapiens2_client.subscriber import FrameMessage, KeypointsMessage, ReceiveTimeout, StatusMessage, Subscriber
from stages.sapiens2.tiny import make_tiny

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[3]
_SCRIPT = Path(sys.executable).parent / "sapiens2-stream"
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "pipeline.cli.main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "cache"
    for task in ("pose", "seg"):
        make_tiny(cache / "tiny" / task, task)
    e = dict(os.environ, HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", SAPIENS2_STREAM_CACHE=str(cache),
             HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return e


def test_cli_publishes_keypoints_frames_and_status(tmp_path: Path, env: dict[str, str]) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [*CLI, "--source", "demo", "--realtime", "--tasks", "pose,seg", "--detector", "full-frame",
         "--fallback-tiny", "--device", "cpu", "--dtype", "float32", "--no-progress", "--publish", endpoint,
         "--source-id", "cam7"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: dict[type, list] = {KeypointsMessage: [], FrameMessage: [], StatusMessage: []}
    try:
        with Subscriber(endpoint, ["keypoints", "frame", "status"]) as sub:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (len(got[KeypointsMessage]) < 3 or not got[FrameMessage]
                                                   or not got[StatusMessage]):
                try:
                    msg = sub.recv(timeout_s=1.0)
                except ReceiveTimeout:
                    assert proc.poll() is None, proc.communicate()[1]
                    continue
                if type(msg) in got:
                    got[type(msg)].append(msg)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    kps = got[KeypointsMessage]
    assert len(kps) >= 3, err
    for msg in kps:
        assert msg.meta.source_id == "cam7" and msg.meta.random_weights
        assert msg.keypoints.shape == (1, 308, 2) and msg.keypoint_scores.shape == (1, 308)
        assert np.isfinite(msg.keypoints).all()
        assert (msg.keypoints[..., 0] <= 1279).all() and (msg.keypoints[..., 1] <= 719).all()
    indices = [m.meta.frame_index for m in kps]
    assert indices == sorted(indices)
    # Every gap is the frames the realtime source skipped (drops.source grew by exactly that much):
    # the counter a message carries is the one of its own frame, not of a later one.
    for a, b in zip(kps, kps[1:]):
        assert b.meta.frame_index - a.meta.frame_index - 1 == b.meta.drops["source"] - a.meta.drops["source"], (
            [(m.meta.frame_index, m.meta.drops["source"]) for m in kps])
    frame = got[FrameMessage][0]
    assert frame.image.shape == (720, 1280, 3) and frame.image.dtype == np.uint8
    status = got[StatusMessage][0]
    assert status.source_id == "cam7" and status.health in ("ok", "starting")
