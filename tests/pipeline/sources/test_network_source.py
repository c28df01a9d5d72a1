"""Network cameras for real: an H.264 stream in MPEG-TS over TCP (tests/livestream.py) read by the
network reader, and a whole run whose camera hangs, is reconnected and restarts its timestamps."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.sources import open_source
from tests.cliutil import CLI, OFFLINE, ctrl_c, killed_on_exit, read_jsonl, strictly_increasing, wait_for
from tests.livestream import LiveStream, cycling

pytestmark = pytest.mark.timeout(300)


def test_a_network_stream_is_read_live_and_its_pictures_arrive() -> None:
    """The network reader on a real stream: live (newest frame wins), the pictures as served."""
    shades = [np.full((240, 320, 3), v, np.uint8) for v in (30, 120, 220)]
    stream = LiveStream(cycling(shades, 0.3), (320, 240))
    source = open_source(stream.url, source_id="net0")
    try:
        assert source.live and (source.info.width, source.info.height) == (320, 240)
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(set(seen)) < 3 or len(seen) < 30:
            assert time.monotonic() < deadline, seen
            frame = source.read(timeout=1.0)
            if frame is not None:
                seen.append(int(round(frame.image.mean())))
        assert set(seen) <= {29, 30, 31, 119, 120, 121, 219, 220, 221}, set(seen)
    finally:
        source.stop()
        stream.stop()
    assert stream.error is None, stream.error


def _moving(t: float) -> np.ndarray:
    image = np.full((120, 160, 3), 60, np.uint8)
    x = int(t * 40) % 120
    image[40:80, x:x + 40] = (230, 200, 40)
    return image


def _lines(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def test_a_network_camera_that_hangs_is_reconnected_and_the_run_goes_on(tiny: Path, cli_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """The camera stops sending with its connection open: after --stall-timeout the run says so, drops
    it and reconnects with backoff; the camera serves the new connection from timestamp 0 again; the
    keypoint file marks the outage, its frames and timestamps keep increasing, and Ctrl-C ends the run."""
    kp = tmp_path / "kp.jsonl"
    frames = lambda: [r for r in _lines(kp) if "frame" in r]  # noqa: E731
    events = lambda: [r["event"] for r in _lines(kp) if "event" in r]  # noqa: E731
    with LiveStream(_moving, (160, 120), fps=15) as stream, killed_on_exit(subprocess.Popen(
            [*CLI, "--source", f"cam0={stream.url}", "--tasks", "pose", *OFFLINE, "--stall-timeout", "1",
             "--save-keypoints", str(kp)], cwd=tmp_path, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)) as proc:
        wait_for(lambda: proc.poll() is not None or len(frames()) >= 10, "10 frames from the stream", 120)
        assert proc.poll() is None, proc.communicate()[1]
        stream.stall()
        wait_for(lambda: proc.poll() is not None or "reconnecting" in events(), "the reconnection", 120)
        assert proc.poll() is None, proc.communicate()[1]
        before = len(frames())
        stream.resume()
        wait_for(lambda: proc.poll() is not None or ("resumed" in events() and len(frames()) >= before + 10),
                 "10 frames after the reconnection", 120)
        assert proc.poll() is None, proc.communicate()[1]
        _, stderr = ctrl_c(proc)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert stream.clients >= 2
    records = read_jsonl(kp)
    marks = [r["event"] for r in records if "event" in r]
    assert marks[:3] == ["stalled", "reconnecting", "resumed"], [r for r in records if "event" in r]
    frames = [r for r in records if "frame" in r]
    assert strictly_increasing([r["frame"] for r in frames])
    assert strictly_increasing([r["pts"] for r in frames]), "pts went backwards when the camera restarted"
    resumed = next(r for r in records if r.get("event") == "resumed")
    assert resumed["outage_s"] >= 1.0, resumed
