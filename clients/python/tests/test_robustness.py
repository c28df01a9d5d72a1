"""The subscriber side under what a hostile or careless publisher, or a bare install, hands it: decoder
failures of any kind are WireErrors, a message's images share one memory budget, image parts of the wrong
encoding are refused, a missing image decoder skips image messages only, and a closed or mis-connected
Subscriber never spins or dies."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq

from sapiens2_client import images, wire
from sapiens2_client.subscriber import KeypointsMessage, ReceiveTimeout, Subscriber, to_message


def _fields() -> dict:
    return wire.meta_fields(wire.FrameMeta("cam0", 0, 0, 1))


def _frame(image: np.ndarray | None = None, index: int = 0) -> list[bytes]:
    image = np.zeros((48, 64, 3), np.uint8) if image is None else image
    fields = wire.meta_fields(wire.FrameMeta("cam0", index, index, 1))
    return wire.encode("frame", "cam0", fields, [wire.Part("image", image, "jpeg")], publish_ns=1)


def _keypoints() -> list[bytes]:
    parts = [wire.Part("keypoints", np.zeros((1, 308, 2), np.float32)),
             wire.Part("keypoint_scores", np.zeros((1, 308), np.float32)),
             wire.Part("boxes", np.zeros((1, 4), np.float32)), wire.Part("box_scores", np.zeros(1, np.float32)),
             wire.Part("track_ids", np.zeros(1, np.int64))]
    return wire.encode("keypoints", "cam0", {**_fields(), "num_persons": 1, "num_keypoints": 308}, parts,
                       publish_ns=1)


@pytest.mark.parametrize("error", [MemoryError(), ValueError("bomb"), RuntimeError("decoder")])
def test_any_failure_of_the_image_decoder_is_a_wire_error(monkeypatch: pytest.MonkeyPatch, error) -> None:
    """Pillow's DecompressionBombError (a JPEG whose second SOF is 20000x20000), MemoryError, ...: the
    decoder is the publisher's to break, the subscriber goes on."""
    def fails(data: bytes):
        raise error

    monkeypatch.setattr(images, "decode_jpeg_rgb", fails)
    with pytest.raises(wire.WireError) as refused:
        wire.decode(_frame())
    assert refused.value.reason == "image"


def test_the_images_of_one_message_share_one_budget() -> None:
    """Two PNG parts of 12000x12000 (each under the per-part limit, together over it): refused before either
    decodes, whatever their bytes."""
    side = 12000
    header = {**_fields(), "schema": wire.SCHEMA, "version": wire.SCHEMA_VERSION, "kind": "matte",
              "source_id": "cam0", "publish_ns": 1, "alpha_scale": 255,
              "parts": [{"name": n, "encoding": "png", "dtype": "|u1", "shape": [side, side]} for n in ("alpha", "x")]}
    frames = [b"matte.cam0", msgpack.packb(header, use_bin_type=True), b"\x89PNG" + b"\0" * 40, b"\x89PNG"]
    assert side * side <= wire.Limits().max_array_bytes < 2 * side * side
    with pytest.raises(wire.MessageTooLarge, match="images of this message"):
        wire.decode(frames)


def test_a_frame_whose_picture_is_not_a_colour_jpeg_is_refused() -> None:
    gray = wire.encode("frame", "cam0", _fields(), [wire.Part("image", np.zeros((48, 64), np.uint8), "png")],
                       publish_ns=1)
    with pytest.raises(wire.WireError) as refused:
        to_message(wire.decode(gray))
    assert refused.value.reason == "encoding"
    raw = wire.encode("seg", "cam0", _fields(), [wire.Part("classes", np.zeros((48, 64, 3), np.uint8))],
                      publish_ns=1)
    with pytest.raises(wire.WireError, match="must be png or raw"):
        to_message(wire.decode(raw))


@pytest.fixture
def pub():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, f"tcp://127.0.0.1:{port}"
    sock.close(linger=0)
    ctx.term()


def _until_received(sock, sub: Subscriber, frames: list[bytes], want: type, deadline_s: float = 30.0):
    """Send (the slow joiner may miss the first ones) until the subscriber returns a ``want``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        sock.send_multipart(frames)
        try:
            msg = sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            continue
        if isinstance(msg, want):
            return msg
    raise AssertionError(f"no {want.__name__} within {deadline_s} s")


@pytest.mark.timeout(60)
def test_without_an_image_decoder_image_messages_are_skipped_and_counted(pub, monkeypatch: pytest.MonkeyPatch,
                                                                          caplog) -> None:
    """A bare install (no OpenCV, no Pillow) subscribed to everything: keypoints go on arriving; frames are
    skipped as 'codec', said once."""
    frame = _frame()  # (encoded while there is an encoder)
    monkeypatch.setattr(images, "_cv2", lambda: None)
    monkeypatch.setattr(images, "_pil", lambda: None)
    sock, endpoint = pub
    with Subscriber(endpoint, [""], timeout_s=5) as sub:
        end = time.monotonic() + 30
        while sub.stats.skipped["codec"] < 3:
            assert time.monotonic() < end, "frames were not skipped"
            sock.send_multipart(frame)
            with pytest.raises(ReceiveTimeout):
                sub.recv(timeout_s=0.1)
        assert isinstance(_until_received(sock, sub, _keypoints(), KeypointsMessage), KeypointsMessage)
    assert sum("skipping frame, seg and matte messages" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.timeout(60)
def test_a_refused_endpoint_leaves_the_subscriber_working(pub) -> None:
    sock, endpoint = pub
    with Subscriber(endpoint, ["keypoints"], timeout_s=5) as sub:
        with pytest.raises(ValueError, match="cannot connect"):
            sub.connect("tcp://127.0.0.1:99999")
        assert isinstance(_until_received(sock, sub, _keypoints(), KeypointsMessage), KeypointsMessage)


@pytest.mark.timeout(60)
def test_receiving_from_a_closed_subscriber_ends_at_once(pub) -> None:
    """(Polling closed sockets returns at once for ever: recv spun at full CPU, ignoring its timeout.)"""
    _, endpoint = pub
    sub = Subscriber(endpoint, [""], timeout_s=None)
    sub.close()
    with pytest.raises(ReceiveTimeout, match="closed"):
        sub.recv()
    assert list(sub) == []


class _Queued:
    """Stands in for the SUB socket: these messages are waiting, then nothing (no timing involved)."""

    closed = False

    def __init__(self, messages: list[list[bytes]]) -> None:
        self.messages = messages

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        if not self.messages:
            raise zmq.Again()
        return self.messages.pop(0)


@pytest.mark.timeout(60)
def test_latest_only_decodes_only_the_newest_queued_image(pub, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty frames waiting: one decode (the newest), nineteen superseded before they cost a decode, and the
    gap counter still sees every index (nothing counted missed)."""
    _, endpoint = pub
    decoded = []
    real = images.decode_jpeg_rgb
    monkeypatch.setattr(images, "decode_jpeg_rgb", lambda data: decoded.append(1) or real(data))
    queue = _Queued([_frame(index=i) for i in range(1, 21)])
    with Subscriber(endpoint, ["frame"], latest_only=True, timeout_s=5) as sub:
        sock, sub._sock = sub._sock, queue
        try:
            sub._drain()
        finally:
            sub._sock = sock
        assert [m.meta.frame_index for m in sub._pending] == [20]
        assert len(decoded) == 1 and sub.stats.superseded == 19 and sub.stats.missed == 0


@pytest.mark.timeout(60)
def test_latest_only_holds_no_more_than_the_socket_would(pub) -> None:
    """A slow reader of keypoints (never superseded): the backlog stays in the socket, bounded by its
    high-water mark (which drops), not in an unbounded queue of decoded messages."""
    _, endpoint = pub
    queue = _Queued([_keypoints() for _ in range(20)])
    with Subscriber(endpoint, ["keypoints"], latest_only=True, rcvhwm=5, timeout_s=5) as sub:
        sock, sub._sock = sub._sock, queue
        try:
            sub._drain()
            sub._drain()
        finally:
            sub._sock = sock
        assert len(sub._pending) == 5 and len(queue.messages) == 15
