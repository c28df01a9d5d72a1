"""CURVE: only listed client keys receive anything."""

from __future__ import annotations

import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pipeline.sinks.publisher import CurveServerKeys, ZmqPublisher
from sapiens2_client.keys import KeysError, make_keys
from sapiens2_client.subscriber import CurveClientKeys, KeypointsMessage, ReceiveTimeout, Subscriber
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo


def _result(i: int) -> FrameResult:
    frame = Frame(i, np.zeros((16, 16, 3), np.uint8), i, Fraction(1, 30), time.time_ns())
    det = Detections(np.ones((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))
    return FrameResult(frame, det, Keypoints(np.full((1, 308, 2), i, np.float32), np.ones((1, 308), np.float32)))


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    make_keys(tmp_path / "keys", ["alice"])
    make_keys(tmp_path / "other", ["mallory"])  # a well-formed key pair the publisher does not list
    return tmp_path


@pytest.fixture
def pub(keys: Path):
    p = ZmqPublisher("tcp://127.0.0.1:*", curve=CurveServerKeys.from_dir(keys / "keys"), status_interval_s=0.1)
    p.open(StreamInfo("cam0", 16, 16, 30.0, Fraction(1, 30), live=True))
    yield p
    p.close()


def test_authorised_subscriber_receives_everything_others_nothing(keys: Path, pub: ZmqPublisher) -> None:
    server_public = CurveServerKeys.from_dir(keys / "keys").public
    mallory = CurveClientKeys.from_dir(keys / "other", "mallory")
    intruder = CurveClientKeys(mallory.public, mallory.secret, server_public)  # knows the server key
    alice = Subscriber(pub.endpoint, ["keypoints"], curve=CurveClientKeys.from_dir(keys / "keys", "alice"))
    bad = Subscriber(pub.endpoint, ["keypoints"], curve=intruder)
    plain = Subscriber(pub.endpoint, ["keypoints"])
    try:
        assert pub.wait_for_subscriber("keypoints.cam0", 5)
        for sub in (bad, plain):  # until each one's handshake was refused (a fixed pause: maybe not yet done)
            deadline = time.monotonic() + 60
            while sub.stats.handshakes_failed == 0:
                assert time.monotonic() < deadline, f"no refused handshake seen: {sub.stats}"
                with pytest.raises(ReceiveTimeout):
                    sub.recv(timeout_s=0.1)
        for i in range(5):
            pub.write(_result(i))
            time.sleep(0.01)
        got = [alice.recv(timeout_s=2) for _ in range(5)]
        assert [m.meta.frame_index for m in got] == list(range(5))
        assert all(isinstance(m, KeypointsMessage) and m.keypoints[0, 0, 0] == m.meta.frame_index for m in got)
        for sub in (bad, plain):
            with pytest.raises(ReceiveTimeout):
                sub.recv(timeout_s=0.5)
            assert sub.stats.received == 0
    finally:
        for s in (alice, bad, plain):
            s.close()


def test_missing_keys_are_actionable(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match="sapiens2-stream keys"):
        CurveServerKeys.from_dir(tmp_path)
    with pytest.raises(KeysError, match="sapiens2-stream keys"):
        CurveClientKeys.from_dir(tmp_path)


def test_a_pipeline_refused_by_a_curve_broker_blames_the_broker_and_never_says_connected(keys: Path,
                                                                                         caplog) -> None:
    """A publisher connecting with keys the broker does not authorise: the TCP connection opens, the
    handshake fails. It said "a subscriber's handshake failed" and then "connected to the broker"."""
    import logging

    from pipeline.net.broker import Broker
    from pipeline.sinks import publisher as publisher_module

    caplog.set_level(logging.INFO, logger=publisher_module.__name__)
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", curve=CurveServerKeys.from_dir(keys / "keys")) as broker:
        server_public = CurveClientKeys.from_dir(keys / "keys", "alice").server_public
        mallory = CurveClientKeys.from_dir(keys / "other", "mallory")
        pub = ZmqPublisher(broker.xsub_endpoint, connect=True, status_interval_s=0.1,
                           curve=CurveClientKeys(mallory.public, mallory.secret, server_public))
        pub.bind()
        try:
            deadline = time.monotonic() + 60
            while "the broker's handshake at" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.05)
        finally:
            pub.close()
    assert "refused by CURVE authentication" in caplog.text, caplog.text
    assert "connected to the broker" not in caplog.text and "a subscriber's handshake" not in caplog.text
    assert "no broker ever answered" in caplog.text
