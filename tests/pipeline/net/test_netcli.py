"""The subscribe / keys / broker commands, run as real subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.sinks.publisher import ZmqPublisher
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.net.commands", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(i: int, source: str = "cam0") -> FrameResult:
    image = np.full((64, 96, 3), (i * 20) % 256, np.uint8)
    frame = Frame(i, image, i, Fraction(1, 30), time.time_ns(), source)
    det = Detections(np.ones((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))
    kp = Keypoints(np.full((1, 308, 2), i, np.float32), np.ones((1, 308), np.float32))
    return FrameResult(frame, det, kp, annotated=image)


def _feed(pub: ZmqPublisher, proc: subprocess.Popen, topic: str, n: int) -> None:
    deadline = time.monotonic() + 15
    while not pub.subscribed(topic):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    for i in range(n):
        pub.write(_result(i))
        time.sleep(0.02)


@pytest.fixture
def pub():
    p = ZmqPublisher("tcp://127.0.0.1:*")
    p.open(StreamInfo("cam0", 96, 64, 30.0, Fraction(1, 30), live=True))
    yield p
    p.close()


def test_subscribe_prints_jsonl(pub: ZmqPublisher) -> None:
    proc = _cli("subscribe", "--endpoint", pub.endpoint, "--json", "--count", "3", "--timeout", "10")
    _feed(pub, proc, "keypoints.cam0", 3)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["frame_index"] for x in lines] == [0, 1, 2]
    assert lines[0]["keypoints"][0][0] == [0.0, 0.0] and lines[0]["persons"] == 1


def test_subscribe_records_frames_and_stops_on_sigterm(pub: ZmqPublisher, tmp_path: Path) -> None:
    out_file = tmp_path / "out.mp4"
    # Frames are recorded, and printed too since the topic is named: stop once all ten of each are in.
    proc = _cli("subscribe", "--endpoint", pub.endpoint, "--record", str(out_file), "--topic", "keypoints",
                "--topic", "frame")
    _feed(pub, proc, "frame.cam0", 10)
    killer = threading.Timer(60, proc.kill)  # a hang ends the test instead of blocking it
    killer.start()
    try:
        lines = [proc.stdout.readline() for _ in range(20)]
    finally:
        killer.cancel()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert sorted(x.split()[0] for x in lines) == ["frame.cam0"] * 10 + ["keypoints.cam0"] * 10, lines
    assert out == ""
    with av.open(str(out_file)) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 10 and (frames[0].width, frames[0].height) == (96, 64)


def test_keys_then_broker_round_trip(tmp_path: Path) -> None:
    proc = _cli("keys", str(tmp_path / "k"), "--client", "alice")
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    for name in ("server.key", "server.key_secret", "clients/alice.key_secret", "authorized/alice.key"):
        assert (tmp_path / "k" / name).is_file()

    broker = _cli("broker", "--xsub", "tcp://127.0.0.1:0", "--xpub", "tcp://127.0.0.1:0")
    try:
        line = broker.stdout.readline()  # "broker: publishers -> EP, subscribers -> EP"
        xsub, xpub = line.split("-> ")[1].split(",")[0], line.split("-> ")[2].strip()
        pub = ZmqPublisher(xsub, connect=True)
        pub.open(StreamInfo("cam0", 96, 64, 30.0, Fraction(1, 30), live=True))
        try:
            sub = _cli("subscribe", "--endpoint", xpub, "--count", "2", "--timeout", "10")
            _feed(pub, sub, "keypoints.cam0", 2)
            out, err = sub.communicate(timeout=15)
            assert sub.returncode == 0, err
            assert [x.split()[1] for x in out.splitlines()] == ["#0", "#1"]
        finally:
            pub.close()
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.communicate(timeout=10)
    assert broker.returncode == 0


@pytest.mark.parametrize(
    "args, match",
    [
        (["subscribe", "--endpoint", "nonsense"], "cannot connect"),
        (["subscribe", "--keys", "/nonexistent"], "sapiens2-stream keys"),
        (["subscribe", "--topic", "frames"], "'frames' matches no message"),  # the kind is frame
        (["broker", "--xsub", "tcp://256.0.0.1:1"], "cannot bind"),
    ],
)
def test_errors_are_one_line(args: list[str], match: str) -> None:
    proc = _cli(*args)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode != 0
    assert err.startswith("error: ") and match in err and len(err.strip().splitlines()) == 1
