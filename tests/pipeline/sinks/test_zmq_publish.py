"""ZmqPublisher + Subscriber on real loopback sockets (ephemeral ports, bounded waits)."""

from __future__ import annotations

import re
import time
from fractions import Fraction
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from pipeline.sinks.publisher import PublishError, ZmqPublisher
from sapiens2_client import wire
from sapiens2_client.subscriber import (
    FrameMessage,
    KeypointsMessage,
    MatteMessage,
    ReceiveTimeout,
    SegMessage,
    StatusMessage,
    Subscriber,
)
from stages.types import Detections, Frame, FrameResult, Keypoints, Matte, StreamInfo
from tests.cliutil import wait_for

H, W = 48, 64
DOCS = Path(__file__).resolve().parents[3] / "docs" / "WIRE.md"


def make_result(i: int, n: int = 2, h: int = H, w: int = W, noise: bool = False) -> FrameResult:
    rng = np.random.default_rng(i)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if noise else np.full((h, w, 3), i % 256, np.uint8)
    frame = Frame(index=i, image=image, pts=i * 3000, time_base=Fraction(1, 90000), capture_ns=1_000_000 * i + 5,
                  source_id="cam0")
    det = Detections(rng.random((n, 4), dtype=np.float32) * 40, rng.random(n, dtype=np.float32), np.arange(n) + 10)
    kp = Keypoints(rng.random((n, 308, 2), dtype=np.float32) * 50, rng.random((n, 308), dtype=np.float32))
    alpha = rng.random((h, w), dtype=np.float32)
    return FrameResult(frame, det, kp, seg=rng.integers(0, 29, (h, w), dtype=np.uint8),
                       matte=Matte(alpha, np.zeros((h, w, 3), np.float32)), annotated=image.copy(),
                       latency_ms={"detect": 1.25, "pose": 4.5}, drops={"source": i}, random_weights=True)


def open_pub(source: str = "cam0", **kw: object) -> ZmqPublisher:
    pub = ZmqPublisher("tcp://127.0.0.1:*", status_interval_s=0.1, **kw)  # type: ignore[arg-type]
    pub.open(StreamInfo(source, W, H, 30.0, Fraction(1, 90000), live=True))
    return pub


def recv_until(sub: Subscriber, pred, n: int, timeout_s: float = 5.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        try:
            msg = sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            continue
        if pred(msg):
            out.append(msg)
    return out


@pytest.fixture
def pub():
    p = open_pub()
    yield p
    p.close()


def test_round_trip_every_field(pub: ZmqPublisher) -> None:
    with Subscriber(pub.endpoint, [""], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("frame.cam0", 5)
        results = [make_result(i) for i in range(4)]
        for r in results:
            pub.write(r)
            time.sleep(0.02)  # a camera's pace; bursts beyond the image high-water mark drop
        got = recv_until(sub, lambda m: not isinstance(m, StatusMessage), 16)
        assert not pub.stats.dropped
    by_kind: dict[type, list] = {}
    for m in got:
        by_kind.setdefault(type(m), []).append(m)
    kinds = (KeypointsMessage, FrameMessage, SegMessage, MatteMessage)
    assert {k: len(v) for k, v in by_kind.items()} == dict.fromkeys(kinds, 4)
    for r, k, f, s, m in zip(results, *(by_kind[t] for t in kinds)):
        for msg in (k, f, s, m):
            meta = msg.meta
            assert (meta.source_id, meta.frame_index, meta.pts, meta.time_base, meta.capture_ns) == (
                "cam0", r.frame.index, r.frame.pts, r.frame.time_base, r.frame.capture_ns)
            assert meta.latency_ms == r.latency_ms and meta.drops == {"source": r.frame.index}
            assert (meta.width, meta.height, meta.random_weights) == (W, H, True)
            assert msg.header["publish_ns"] >= r.frame.capture_ns
        assert np.array_equal(k.keypoints, r.keypoints.xy) and np.array_equal(k.keypoint_scores, r.keypoints.scores)
        assert np.array_equal(k.boxes, r.detections.boxes) and np.array_equal(k.box_scores, r.detections.scores)
        assert np.array_equal(k.track_ids, r.detections.track_ids) and k.header["num_persons"] == 2
        assert np.abs(f.image.astype(int) - r.annotated.astype(int)).max() <= 2 and f.annotated
        assert np.array_equal(s.classes, r.seg)
        assert np.abs(m.alpha_float - r.matte.alpha).max() <= 0.5 / 255 + 1e-6


def test_status_reports_fps_health_and_drops(pub: ZmqPublisher) -> None:
    with Subscriber(pub.endpoint, ["status"], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("status.cam0", 5)
        pub.set_health("stalled")
        msg = recv_until(sub, lambda m: m.health == "stalled", 1)[0]
    assert isinstance(msg, StatusMessage) and msg.source_id == "cam0" and msg.frames == 0
    assert set(msg.header) >= {"fps", "drops", "health", "uptime_s", "width", "height", "random_weights"}


def test_a_source_closed_while_others_run_says_closed_once_then_nothing(pub: ZmqPublisher) -> None:
    pub.open(StreamInfo("cam1", W, H, 30.0, Fraction(1, 90000), live=True))
    with Subscriber(pub.endpoint, ["status.cam1"], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("status.cam1", 5)
        assert recv_until(sub, lambda m: m.health == "ok", 1)
        pub.close_source("cam1")  # it ended or was removed; cam0 runs on
        assert recv_until(sub, lambda m: m.health == "closed", 1)
        assert recv_until(sub, lambda m: True, 1, timeout_s=1.5) == []  # 15 status intervals: none for cam1
    with Subscriber(pub.endpoint, ["status.cam0"], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("status.cam0", 5)
        assert [m.health for m in recv_until(sub, lambda m: True, 3)] == ["ok"] * 3


def test_images_are_not_encoded_without_subscribers(pub: ZmqPublisher) -> None:
    with Subscriber(pub.endpoint, ["keypoints"], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("keypoints.cam0", 5)
        for i in range(3):
            pub.write(make_result(i))
        assert len(recv_until(sub, lambda m: True, 3)) == 3
    assert pub.stats.encoded["keypoints"] == 3
    assert pub.stats.encoded["frame"] == pub.stats.encoded["seg"] == pub.stats.encoded["matte"] == 0


def test_keypoints_none_publishes_zero_keypoints(pub: ZmqPublisher) -> None:
    r = make_result(0, n=0)
    r.keypoints = None
    with Subscriber(pub.endpoint, ["keypoints"], timeout_s=2) as sub:
        assert pub.wait_for_subscriber("keypoints.cam0", 5)
        pub.write(r)
        (msg,) = recv_until(sub, lambda m: True, 1)
    assert msg.keypoints.shape == (0, 0, 2) and msg.boxes.shape == (0, 4)


def _run_with_stalled_subscriber(pub: ZmqPublisher, healthy: Subscriber, n: int) -> tuple[float, float]:
    big = [make_result(i, h=480, w=640, noise=True) for i in range(8)]  # noisy images, ~0.3 MB each
    worst, t0 = 0.0, time.monotonic()
    for i in range(n):
        r = big[i % 8]
        r.frame.index = i
        s = time.perf_counter()
        pub.write(r)
        worst = max(worst, time.perf_counter() - s)
        if i % 10 == 0:  # the healthy one keeps reading: what has come, and the keypoints of this frame
            recv_until(healthy, lambda m: isinstance(m, KeypointsMessage) and m.meta.frame_index == i, 1)
    return worst, time.monotonic() - t0


@pytest.mark.parametrize("isolate", [True, False])
def test_stalled_subscriber_does_not_slow_publisher_and_drops_are_reported(isolate: bool) -> None:
    pub = open_pub(isolate_subscribers=isolate)
    stalled = Subscriber(pub.endpoint, ["frame", "seg", "matte"], rcvhwm=2)
    healthy = Subscriber(pub.endpoint, ["keypoints", "status"], timeout_s=2)
    n = 150
    try:
        assert pub.wait_for_subscriber("frame.cam0", 5) and pub.wait_for_subscriber("status.cam0", 5)
        worst, elapsed = _run_with_stalled_subscriber(pub, healthy, n)
        assert worst < 10.0 and elapsed < 120, (worst, elapsed)  # a blocking send would never return (bounds: load)
        dropped = sum(pub.stats.dropped[k] for k in ("frame", "seg", "matte"))
        assert dropped >= (1 if isolate else n), pub.stats  # isolating: the first of each stall is counted
        status = recv_until(healthy, lambda m: isinstance(m, StatusMessage)
                            and sum(v for k, v in m.drops.items() if k.startswith("publish_")) > 0, 1)
        assert status, "no status with drop counters reached the healthy subscriber"
        pub.write(make_result(n))
        recv_until(healthy, lambda m: isinstance(m, KeypointsMessage) and m.meta.frame_index == n, 1)
        assert healthy.stats.missed == 0  # keypoints are not held back by the stalled frame reader
    finally:
        stalled.close()
        healthy.close()
        pub.close()


def test_isolated_subscribers_get_everything_while_another_stalls() -> None:
    pub = open_pub()
    stalled = Subscriber(pub.endpoint, [""], rcvhwm=2)
    healthy = Subscriber(pub.endpoint, ["frame"], timeout_s=2)
    try:
        assert pub.wait_for_subscriber("frame.cam0", 5)
        got = []
        big = make_result(0, h=480, w=640, noise=True)
        for i in range(40):
            big.frame.index = i
            pub.write(big)
            got += recv_until(healthy, lambda m: True, 1, timeout_s=1)
        assert sum(pub.stats.dropped.values()) >= 1  # the stalled subscriber's queue did fill up
        assert [m.meta.frame_index for m in got] == list(range(40))
    finally:
        stalled.close()
        healthy.close()
        pub.close()


def test_the_pictures_of_a_stopped_subscriber_are_not_encoded_until_it_reads_again() -> None:
    """The one subscriber of the frames stops reading: once its queue is full the publisher stops
    encoding frames for it (each skipped one a counted drop; a try now and then, which finds it
    still full), so a stopped subscriber costs no JPEG encoding; once it reads again, frames reach
    it again."""
    pub = open_pub(sndhwm=4)
    stopped = Subscriber(pub.endpoint, ["frame"], rcvhwm=2)
    n = 300
    try:
        assert pub.wait_for_subscriber("frame.cam0", 5)
        big = make_result(0, h=480, w=640, noise=True)  # ~0.3 MB of JPEG: the socket buffers fill in a few
        for i in range(n):
            big.frame.index = i
            pub.write(big)
        encoded = pub.stats.encoded["frame"]
        assert encoded < n // 2, f"{encoded} of {n} frames encoded for a subscriber that reads nothing"
        # Until its next try is due (the wait between tries has grown meanwhile): that try finds it still
        # full (the socket buffers may have grown by a few frames meanwhile).
        topic = b"frame.cam0"
        assert pub._subscriptions.full(topic), "the stopped subscriber was never marked full"
        wait_for(lambda: not pub._subscriptions.full(topic), "its next try", 30, every_s=0.02)
        for i in range(n, n + 200):
            big.frame.index = i
            pub.write(big)
        again = pub.stats.encoded["frame"] - encoded
        assert again < 100, f"{again} of 200 frames encoded again for a subscriber that still reads nothing"
        assert pub.stats.sent["frame"] + pub.stats.dropped["frame"] == n + 200  # every frame sent or counted
        recv_until(stopped, lambda m: False, 1, timeout_s=1.0)  # it reads again: its queue empties
        deadline, got = time.monotonic() + 30, []
        while not got and time.monotonic() < deadline:
            big.frame.index += 1
            pub.write(big)
            got = recv_until(stopped, lambda m: isinstance(m, FrameMessage) and m.meta.frame_index >= n + 200, 1, 0.1)
        assert got, "frames never reached the subscriber once it read again"
    finally:
        stopped.close()
        pub.close()


def test_late_joiner_and_restarted_subscriber_get_next_frames(pub: ZmqPublisher) -> None:
    for i in range(3):
        pub.write(make_result(i))  # nobody listens yet: nothing encoded
    assert pub.stats.encoded["keypoints"] == 0
    for attempt in range(2):  # second round: a crashed subscriber (closed, no linger) restarting
        with Subscriber(pub.endpoint, ["keypoints"], timeout_s=2) as sub:
            assert pub.wait_for_subscriber("keypoints.cam0", 5)
            base = 10 * (attempt + 1)
            for i in range(base, base + 3):
                pub.write(make_result(i))
            got = recv_until(sub, lambda m: True, 3)
        assert [m.meta.frame_index for m in got] == [base, base + 1, base + 2]
        deadline = time.monotonic() + 5
        while pub.subscribed("keypoints.cam0") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pub.subscribed("keypoints.cam0")


def test_latest_only_drains_to_newest_frame(pub: ZmqPublisher) -> None:
    with Subscriber(pub.endpoint, ["frame"], latest_only=True, timeout_s=5) as sub:
        assert pub.wait_for_subscriber("frame.cam0", 5)
        for i in range(4):
            pub.write(make_result(i))
        got = []
        while not got or got[-1] != 3:  # however the four arrive, each receive hands out the newest there is
            msg = sub.recv()
            assert isinstance(msg, FrameMessage)
            got.append(msg.meta.frame_index)
        assert got == sorted(got) and len(got) + sub.stats.superseded == 4
        with pytest.raises(ReceiveTimeout, match="within"):
            sub.recv(timeout_s=0.1)
        for i in range(4, 8):  # queued before anybody receives: one receive skips to the last
            pub.write(make_result(i))
        deadline = time.monotonic() + 10
        while sub._sock.poll(0) == 0 or not _all_queued(sub, 4):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert sub.recv().meta.frame_index == 7


def _all_queued(sub: Subscriber, n: int) -> bool:
    """Take what has arrived into the subscriber's own queue; True once ``n`` messages are waiting there."""
    while sub._receive_one():
        pass
    return len(sub._pending) >= n


def _raw_pub() -> tuple[zmq.Context, zmq.Socket, str]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.linger = 0
    sock.bind("tcp://127.0.0.1:*")
    return ctx, sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def test_malformed_and_oversized_are_skipped_and_counted() -> None:
    ctx, sock, ep = _raw_pub()
    good = wire.encode("status", "cam0", {"fps": 1.0, "health": "ok", "frames": 1, "last_frame_index": 0,
                                          "drops": {}}, publish_ns=1)
    try:
        with Subscriber(ep, [""], timeout_s=0.2, max_message_bytes=10_000) as sub:
            deadline = time.monotonic() + 5
            while not recv_until(sub, lambda m: True, 1, timeout_s=0.05):
                sock.send_multipart(good)  # slow-joiner: repeat until one gets through
                assert time.monotonic() < deadline
            sock.send_multipart([b"status.cam0", b"\xc1junk"])
            sock.send_multipart([b"status.cam0", b"x" * 6_000, b"y" * 6_000])  # each frame fits, the sum does not
            sock.send(b"status.single")
            sock.send_multipart(good)
            msg = recv_until(sub, lambda m: True, 1)[0]
            assert isinstance(msg, StatusMessage)
            assert (sub.stats.malformed, sub.stats.oversized) == (2, 1)
            assert sub.stats.skipped == {"header": 1, "too_large": 1, "frames": 1}
            header = msgpack.unpackb(good[1])
            header["version"] = wire.SCHEMA_VERSION + 1
            sock.send_multipart([good[0], msgpack.packb(header)])  # another publisher's version: skipped, counted
            sock.send_multipart(good)
            assert isinstance(recv_until(sub, lambda m: True, 1)[0], StatusMessage)
            assert sub.stats.skipped["version"] == 1
        with Subscriber(ep, [""], timeout_s=0.2, strict_version=True) as strict:
            deadline = time.monotonic() + 5
            while not recv_until(strict, lambda m: True, 1, timeout_s=0.05):
                sock.send_multipart(good)
                assert time.monotonic() < deadline
            sock.send_multipart([good[0], msgpack.packb(header)])
            with pytest.raises(wire.SchemaVersionError, match="install matching"):
                strict.recv(timeout_s=2)
    finally:
        sock.close()
        ctx.term()


def test_source_filter_keeps_exact_source() -> None:
    p1, p10 = open_pub("cam1"), open_pub("cam10")
    try:
        with Subscriber(p1.endpoint, ["keypoints"], sources=["cam1"], timeout_s=2) as sub:
            sub.connect(p10.endpoint)  # one subscriber, two publishers
            assert p1.wait_for_subscriber("keypoints.cam1", 5)
            assert p10.wait_for_subscriber("keypoints.cam10", 5)  # prefix "keypoints.cam1" matches cam10
            p10.write(make_result(0))
            p1.write(make_result(1))
            got = recv_until(sub, lambda m: True, 1)
            with pytest.raises(ReceiveTimeout):
                sub.recv(timeout_s=0.3)
            assert [m.meta.source_id for m in got] == ["cam1"] and sub.stats.filtered == 1
    finally:
        p1.close()
        p10.close()


def test_bind_conflict_is_a_publish_error(pub: ZmqPublisher) -> None:
    other = ZmqPublisher(pub.endpoint)
    with pytest.raises(PublishError, match="choose another endpoint"):
        other.open(StreamInfo("cam0", W, H, None, None, live=True))


def test_close_is_bounded_with_unread_messages() -> None:
    p = open_pub(linger_ms=200)
    sub = Subscriber(p.endpoint, [""], rcvhwm=1)
    assert p.wait_for_subscriber("frame.cam0", 5)
    for i in range(20):
        p.write(make_result(i, h=480, w=640, noise=True))
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 10  # linger 200 ms; without it close would wait for a reader forever
    sub.close()


def test_docs_example_decodes_keypoints(pub: ZmqPublisher, capsys) -> None:
    """The Python example in docs/WIRE.md, run as-is (pyzmq + msgpack + numpy only) against a publisher."""
    import threading

    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert not re.search(r"^\s*(import|from) (pipeline|sapiens2_client|stages)", code, re.M)
    assert len(code.strip().splitlines()) <= 40
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(code, str(DOCS), "exec"), namespace)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            namespace["main"](pub.endpoint, count=3)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert pub.wait_for_subscriber("keypoints.cam0", 5)
    r = make_result(3)
    for i in range(3):
        r.frame.index = 3 + i
        pub.write(r)
    thread.join(15)
    assert not thread.is_alive() and not errors, errors
    out = capsys.readouterr().out.splitlines()
    assert out == [f"cam0 {i} (2, 308, 2)" for i in (3, 4, 5)]
    header, arrays = namespace["decode"](wire.encode("keypoints", "cam0", wire.meta_fields(wire.FrameMeta("cam0", 9)),
                                                     [wire.Part("keypoints", r.keypoints.xy)], publish_ns=1))
    assert header["frame_index"] == 9 and np.array_equal(arrays["keypoints"], r.keypoints.xy)
