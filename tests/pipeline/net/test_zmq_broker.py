"""4 publishers -> broker -> 2 subscribers on loopback."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest

from pipeline.net.broker import Broker, BrokerError
from pipeline.sinks.publisher import ZmqPublisher
from sapiens2_client.subscriber import KeypointsMessage, ReceiveTimeout, Subscriber
from stages.types import Detections, Frame, FrameResult, Keypoints, StreamInfo


def _result(source: str, i: int) -> FrameResult:
    frame = Frame(i, np.zeros((16, 16, 3), np.uint8), i, Fraction(1, 30), time.time_ns(), source)
    det = Detections(np.ones((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64))
    return FrameResult(frame, det, Keypoints(np.full((1, 308, 2), i, np.float32), np.ones((1, 308), np.float32)))


def test_four_publishers_two_subscribers_every_message_once() -> None:
    sources = [f"cam{i}" for i in range(4)]
    n = 40
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        subs = [Subscriber(broker.xpub_endpoint, ["keypoints"]) for _ in range(2)]
        pubs = [ZmqPublisher(broker.xsub_endpoint, connect=True) for _ in sources]
        try:
            for p, s in zip(pubs, sources):
                p.open(StreamInfo(s, 16, 16, 30.0, Fraction(1, 30), live=True))
            for p, s in zip(pubs, sources):
                assert p.wait_for_subscriber(f"keypoints.{s}", 5), "subscription did not cross the broker"
            # The broker forwards the first subscription upstream; the second subscriber's may still
            # be on its way to the broker. Probe until both receive, so the test measures delivery.
            warm = ZmqPublisher(broker.xsub_endpoint, connect=True)
            warm.open(StreamInfo("warmup", 16, 16, 30.0, Fraction(1, 30), live=True))
            assert warm.wait_for_subscriber("keypoints.warmup", 5)
            deadline = time.monotonic() + 10
            ready = [False, False]
            while not all(ready) and time.monotonic() < deadline:
                warm.write(_result("warmup", 0))
                for j, sub in enumerate(subs):
                    try:
                        for _ in range(100):  # bounded: a message storm must fail, not hang
                            ready[j] = ready[j] or sub.recv(timeout_s=0.05).meta.source_id == "warmup"
                    except ReceiveTimeout:
                        pass
            warm.close()
            assert all(ready), "subscribers never connected through the broker"
            for i in range(n):
                for p, s in zip(pubs, sources):
                    p.write(_result(s, i))
                time.sleep(0.002)
            for sub in subs:
                seen: dict[str, list[int]] = {s: [] for s in sources}
                for _ in range(10 * n * len(sources)):  # bounded: duplicates must fail, not hang
                    try:
                        msg = sub.recv(timeout_s=1.0)
                    except ReceiveTimeout:
                        break
                    assert isinstance(msg, KeypointsMessage)
                    if msg.meta.source_id != "warmup":
                        seen[msg.meta.source_id].append(msg.meta.frame_index)
                assert seen == {s: list(range(n)) for s in sources}
        finally:
            for p in pubs:
                p.close()
            for sub in subs:
                sub.close()


def test_busy_port_is_a_broker_error() -> None:
    with Broker("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as broker:
        with pytest.raises(BrokerError, match="pick free ports"):
            Broker(broker.xsub_endpoint, "tcp://127.0.0.1:*")
