"""Subscriber: receive sapiens2-stream messages as typed records (see docs/WIRE.md).

Malformed and oversized messages are skipped and counted in ``Subscriber.stats``; a message
from a publisher with another schema version raises SchemaVersionError (unless
strict_version=False, when it is counted as malformed). latest_only drains the socket on
every receive and keeps only the newest image message (frame/seg/matte) of each topic.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import zmq
import zmq.auth

from sapiens2_client import wire
from sapiens2_client.wire import FrameMeta, MessageTooLarge, SchemaVersionError, WireError

log = logging.getLogger(__name__)

_UNSET: Any = object()
_DRAIN_LIMIT = 10_000  # bounded drain so a flood cannot keep recv() busy forever


class ReceiveTimeout(TimeoutError):
    """No message arrived within the receive timeout."""


@dataclass(frozen=True)
class CurveClientKeys:
    """A subscriber's CURVE key pair plus the publisher's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def from_dir(cls, keys_dir: str | Path, name: str = "client") -> CurveClientKeys:
        """Load ``clients/<name>.key_secret`` and ``server.key`` made by ``sapiens2-stream keys``."""
        keys_dir = Path(keys_dir)
        secret_file, server_file = keys_dir / "clients" / f"{name}.key_secret", keys_dir / "server.key"
        for f in (secret_file, server_file):
            if not f.is_file():
                raise FileNotFoundError(f"{f} not found; create keys with `sapiens2-stream keys {keys_dir}`")
        public, secret = zmq.auth.load_certificate(secret_file)
        server_public, _ = zmq.auth.load_certificate(server_file)
        assert secret is not None
        return cls(public=public, secret=secret, server_public=server_public)


@dataclass
class KeypointsMessage:
    """keypoints: (N, K, 2) float32 pixels; keypoint_scores: (N, K); boxes: (N, 4) xyxy;
    box_scores: (N,); track_ids: (N,) int64, -1 when untracked. K is 0 when not computed."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    keypoints: np.ndarray
    keypoint_scores: np.ndarray
    boxes: np.ndarray
    box_scores: np.ndarray
    track_ids: np.ndarray


@dataclass
class FrameMessage:
    """image: (H, W, 3) uint8 RGB, decoded from JPEG; annotated: whether overlays are drawn."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    image: np.ndarray
    annotated: bool


@dataclass
class SegMessage:
    """classes: (H, W) uint8 class ids, decoded from PNG (lossless)."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    classes: np.ndarray


@dataclass
class MatteMessage:
    """alpha: (H, W) uint8, alpha_float = alpha / 255 in [0, 1]."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    alpha: np.ndarray

    @property
    def alpha_float(self) -> np.ndarray:
        return self.alpha.astype(np.float32) / float(self.header.get("alpha_scale", 255))


@dataclass
class StatusMessage:
    """Periodic health of one source: fps, drop counters, health string."""

    topic: str
    header: dict[str, Any]
    source_id: str
    publish_ns: int
    fps: float
    health: str
    frames: int
    last_frame_index: int
    drops: dict[str, int]


Message = Union[KeypointsMessage, FrameMessage, SegMessage, MatteMessage, StatusMessage]


def to_message(d: wire.Decoded) -> Message:
    """Turn a decoded wire message into its typed record; raises WireError on missing fields."""
    h, a = d.header, d.arrays
    try:
        if d.kind == "status":
            return StatusMessage(
                d.topic, h, d.source_id, int(h["publish_ns"]), float(h["fps"]), str(h["health"]),
                int(h["frames"]), int(h["last_frame_index"]), dict(h["drops"]),
            )
        meta = wire.meta_from_header(h)
        if d.kind == "keypoints":
            return KeypointsMessage(
                d.topic, h, meta, a["keypoints"], a["keypoint_scores"], a["boxes"], a["box_scores"], a["track_ids"]
            )
        if d.kind == "frame":
            return FrameMessage(d.topic, h, meta, a["image"], bool(h.get("annotated", False)))
        if d.kind == "seg":
            return SegMessage(d.topic, h, meta, a["classes"])
        return MatteMessage(d.topic, h, meta, a["alpha"])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise WireError(f"{d.kind} message lacks or mangles a field: {e!r}") from e


@dataclass
class SubscriberStats:
    """What the subscriber received, skipped and why."""

    received: int = 0
    malformed: int = 0
    oversized: int = 0
    superseded: int = 0  # older image messages discarded by latest_only
    filtered: int = 0  # other sources, when sources= is given
    missed: int = 0  # frame_index gaps per topic: messages the publisher or network dropped


class Subscriber:
    """Connects a SUB socket and yields typed messages.

    topics are prefixes: a kind ("keypoints"), a kind and source ("frame.cam0") or "" for all.
    sources, when given, keeps only those exact source ids (prefix "frame.cam1" also matches
    "frame.cam10"). timeout_s=None waits forever; iterating stops when a timeout passes.
    """

    def __init__(
        self,
        endpoint: str = wire.DEFAULT_ENDPOINT,
        topics: Sequence[str] = ("keypoints",),
        *,
        sources: Sequence[str] | None = None,
        latest_only: bool = False,
        timeout_s: float | None = None,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
        strict_version: bool = True,
        rcvhwm: int = 100,
        curve: CurveClientKeys | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        if isinstance(topics, str):
            topics = [topics]
        self.endpoint = endpoint
        self.sources = None if sources is None else frozenset(sources)
        self.latest_only = latest_only
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.strict_version = strict_version
        self.stats = SubscriberStats()
        self._pending: collections.deque[Message] = collections.deque()
        self._last_index: dict[str, int] = {}
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)
        if curve is not None:
            self._sock.curve_secretkey = curve.secret
            self._sock.curve_publickey = curve.public
            self._sock.curve_serverkey = curve.server_public
        for prefix in _prefixes(topics, sources):
            self._sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise ValueError(f"cannot connect to {endpoint!r}: {e}; expected e.g. tcp://127.0.0.1:5555") from e

    def recv(self, timeout_s: float | None = _UNSET) -> Message:
        """The next message; raises ReceiveTimeout when none arrives in time."""
        timeout = self.timeout_s if timeout_s is _UNSET else timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.latest_only:
                self._drain()
            if self._pending:
                return self._pending.popleft()
            wait_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(wait_ms, zmq.POLLIN):
                raise ReceiveTimeout(f"no message from {self.endpoint} within {timeout} s")
            self._receive_one()

    def __iter__(self) -> Iterator[Message]:
        """Yield messages until a receive timeout passes (forever when timeout_s is None)."""
        while True:
            try:
                yield self.recv()
            except ReceiveTimeout:
                return

    def close(self) -> None:
        """Close the socket (no linger) and the context when this subscriber made it."""
        if not self._sock.closed:
            self._sock.close(linger=0)
        if self._own_ctx and not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive_one(self) -> bool:
        try:
            frames = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return False
        try:
            msg = to_message(wire.decode(frames, max_bytes=self.max_message_bytes))
        except MessageTooLarge as e:
            self.stats.oversized += 1
            log.debug("skipped: %s", e)
            return True
        except SchemaVersionError:
            if self.strict_version:
                raise
            self.stats.malformed += 1
            return True
        except WireError as e:
            self.stats.malformed += 1
            log.debug("skipped malformed message: %s", e)
            return True
        source = msg.source_id if isinstance(msg, StatusMessage) else msg.meta.source_id
        if self.sources is not None and source not in self.sources:
            self.stats.filtered += 1
            return True
        self.stats.received += 1
        if not isinstance(msg, StatusMessage):
            last = self._last_index.get(msg.topic)
            if last is not None and msg.meta.frame_index > last + 1:
                self.stats.missed += msg.meta.frame_index - last - 1
            self._last_index[msg.topic] = msg.meta.frame_index
        self._pending.append(msg)
        return True

    def _drain(self) -> None:
        """Take everything already queued, then keep only the newest image message per topic."""
        for _ in range(_DRAIN_LIMIT):
            if not self._receive_one():
                break
        newest: dict[str, int] = {}
        for i, m in enumerate(self._pending):
            if isinstance(m, (FrameMessage, SegMessage, MatteMessage)):
                newest[m.topic] = i
        if not newest:
            return
        kept = collections.deque()
        for i, m in enumerate(self._pending):
            if isinstance(m, (FrameMessage, SegMessage, MatteMessage)) and newest[m.topic] != i:
                self.stats.superseded += 1
            else:
                kept.append(m)
        self._pending = kept


def _prefixes(topics: Sequence[str], sources: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for t in topics:
        if sources and t in wire.KINDS:
            out.extend(f"{t}.{s}" for s in sources)
        else:
            out.append(t)
    return out
