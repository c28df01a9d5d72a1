"""Subscriber: receive sapiens2-stream messages as typed records (see docs/WIRE.md).

A subscriber survives any message and anything the network does. The socket refuses frames larger
than ``max_message_bytes`` before they are received (ZMQ_MAXMSGSIZE: libzmq drops the connection and,
as after any protocol error, never makes it again, so the subscriber does, once it has taken every
whole message the socket holds: ``sapiens2_client.connection``); a publisher that exits or is killed
is reconnected by libzmq itself. ``stats.disconnects`` counts both, ``stats.reconnects`` the first
kind. Every message that does arrive is validated by ``wire.decode`` and, when malformed, skipped and
counted by reason in ``Subscriber.stats`` (``skipped["shape"]``, ...). A message of another schema
version is counted too (``skipped["version"]``) and logged once per source: one old publisher behind
a broker must not stop a subscriber that reads the others. ``latest_only`` drains the socket on every
receive and keeps only the newest image message (frame/seg/matte) of each topic.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import wire
from .connection import ConnectionKeeper
from .endpoints import check_endpoint
from .images import CodecMissing
from .keys import CurveClientKeys
from .messages import (
    FrameMessage,
    KeypointsMessage,
    MatteMessage,
    Message,
    SegMessage,
    StatusMessage,
    WorldMessage,
    to_message,
)

log = logging.getLogger(__name__)

__all__ = ["CurveClientKeys", "FrameMessage", "KeypointsMessage", "MatteMessage", "Message", "ReceiveTimeout",
           "SegMessage", "StatusMessage", "Subscriber", "SubscriberStats", "WorldMessage", "to_message"]

_UNSET: Any = object()
_DRAIN_LIMIT = 10_000  # bounded drain so a flood cannot keep recv() busy forever
MAX_GAP = 2**20  # frames missed in one gap at most (over 9 hours at 30 fps); a larger leap is a restart


class ReceiveTimeout(TimeoutError):
    """No message arrived within the receive timeout."""


@dataclass
class SubscriberStats:
    """What the subscriber received, skipped and why."""

    received: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)  # reason -> messages refused
    superseded: int = 0  # older image messages discarded by latest_only
    filtered: int = 0  # other sources, when sources= is given
    missed: int = 0  # frame_index gaps per topic the source's own skips do not explain: publisher or network drops
    restarts: int = 0  # frame_index went backwards or leapt over MAX_GAP: a new baseline, nothing missed
    disconnects: int = 0  # connections lost (a publisher that went away, an oversized message) and made again
    reconnects: int = 0  # of those, made again by the subscriber: libzmq would not (a message over the size limit)
    handshakes_failed: int = 0  # refused by the publisher (CURVE keys missing or not authorised); libzmq retries
    handshakes_refused: int = 0  # of those, the publisher's answer was "not authorised" (the rest: wrong server key)

    @property
    def malformed(self) -> int:
        """Messages refused for any reason but their size."""
        return sum(n for reason, n in self.skipped.items() if reason != "too_large")

    @property
    def oversized(self) -> int:
        return self.skipped["too_large"]


class Subscriber:
    """Connects a SUB socket and yields typed messages.

    topics are prefixes: a kind ("keypoints"), a kind and source ("frame.cam0", "world.rig") or "" for all.
    sources, when given, keeps only those exact source ids (prefix "frame.cam1" also matches
    "frame.cam10"). timeout_s=None waits forever; iterating stops when a timeout passes.
    ``strict_version=True`` raises SchemaVersionError instead of skipping such messages.
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
        limits: wire.Limits | None = None,
        strict_version: bool = False,
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
        self.limits = wire.Limits(max_message_bytes=max_message_bytes) if limits is None else limits
        self.strict_version = strict_version
        self.stats = SubscriberStats()
        self._pending: collections.deque[Message] = collections.deque()
        self._last_index: dict[str, tuple[int, int]] = {}  # topic -> (frame_index, drops.source) last seen
        self._warned_versions: set[str] = set()
        self._warned_codec = False
        self._rcvhwm = max(1, rcvhwm)  # latest_only holds no more decoded messages than the socket would
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)
        # Frames over the limit are refused while they arrive (the peer is disconnected), never buffered.
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        if curve is not None:
            curve.apply(self._sock)
        for prefix in _prefixes(topics, sources):
            self._sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        self._endpoints: list[str] = []
        self._watch = ConnectionKeeper(self._sock, self._endpoints, self._rcvhwm)
        self._held: collections.deque[list[bytes]] = collections.deque()  # taken out before a reconnect
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._watch.monitor, zmq.POLLIN)
        try:
            self.connect(endpoint)
        except ValueError:
            self.close()
            raise

    def connect(self, endpoint: str) -> None:
        """Receive from another publisher (or broker) too; ValueError for an endpoint ZeroMQ refuses."""
        try:  # (a refused endpoint leaves the subscriber as it was: its other connections go on)
            check_endpoint(endpoint, bind=False)
        except ValueError as e:
            raise ValueError(f"cannot connect: {e}") from None
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot connect to {endpoint!r}: {e}; expected e.g. {wire.DEFAULT_ENDPOINT}") from e
        self._endpoints.append(endpoint)

    def recv(self, timeout_s: float | None = _UNSET) -> Message:
        """The next message; raises ReceiveTimeout when none arrives in time."""
        timeout = self.timeout_s if timeout_s is _UNSET else timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._sock.closed:  # (polling closed sockets returns at once, for ever)
                raise ReceiveTimeout(f"the subscriber of {self.endpoint} is closed")
            if self.latest_only:
                self._drain()
            if self._pending:
                return self._pending.popleft()
            if self._held:
                self._handle(self._held.popleft())
                continue
            if self._watch.remake_due(self._held.append):
                self.stats.reconnects = self._watch.remade
                continue
            wait_ms = None if deadline is None else max(0, math.ceil((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(self._watch.due_ms(wait_ms)))
            if not ready and deadline is not None and time.monotonic() >= deadline:
                raise ReceiveTimeout(f"no message from {self.endpoint} within {timeout} s")
            if self._watch.monitor in ready:
                self._note_connections()
            if self._sock in ready:
                self._receive_one()

    def _note_connections(self) -> None:
        """Count dropped connections and refused handshakes (libzmq, or the watch, connects again)."""
        for dropped in self._watch.read_events():
            if dropped.handshake_failed:
                self.stats.handshakes_failed += 1
                self.stats.handshakes_refused += dropped.not_authorised
            else:
                log.debug("connection to %s dropped", dropped.endpoint)
        self.stats.disconnects = self._watch.disconnects

    def __iter__(self) -> Iterator[Message]:
        """Yield messages until a receive timeout passes (forever when timeout_s is None)."""
        while True:
            try:
                yield self.recv()
            except ReceiveTimeout:
                return

    def close(self) -> None:
        """Close the socket (no linger) and the context when this subscriber made it."""
        watch = getattr(self, "_watch", None)
        if watch is not None:
            watch.close()
        if not self._sock.closed:
            self._sock.close(linger=0)
        if self._own_ctx and not self._ctx.closed:
            self._ctx.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_raw(self) -> list[bytes] | None:
        """The next whole message: one held back by a reconnect first, then the socket's; None if none."""
        if self._held:
            return self._held.popleft()
        try:
            frames = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        self._watch.received()
        return frames

    def _receive_one(self) -> bool:
        frames = self._next_raw()
        return False if frames is None else self._handle(frames)

    def _handle(self, frames: list[bytes]) -> bool:
        try:
            msg = to_message(wire.decode(frames, limits=self.limits))
        except wire.SchemaVersionError as e:
            if self.strict_version:
                raise
            self._skip(e)
            topic = bytes(frames[0][:80]).decode("ascii", "replace")
            if topic not in self._warned_versions:
                self._warned_versions.add(topic)
                log.warning("skipping %s: %s", topic, e)
            return True
        except wire.WireError as e:
            self._skip(e)
            return True
        except CodecMissing as e:  # an image message without an image decoder here: the others go on
            self.stats.skipped["codec"] += 1
            if not self._warned_codec:
                self._warned_codec = True
                log.warning("skipping frame, seg and matte messages: %s", e)
            return True
        source = msg.source_id if isinstance(msg, StatusMessage) else msg.meta.source_id
        if self.sources is not None and source not in self.sources:
            self.stats.filtered += 1
            return True
        self.stats.received += 1
        if not isinstance(msg, StatusMessage):
            self._count_gap(msg.topic, msg.meta.frame_index, msg.meta.drops.get("source", 0))
        self._pending.append(msg)
        return True

    def _count_gap(self, topic: str, index: int, source_skipped: int) -> None:
        """Count the frames between this message and the last of its topic as missed, less those the
        pipeline's source skipped (``drops.source`` grew by them: they were never published), unless
        the index went backwards or leapt more than MAX_GAP ahead: that is a restarted (or hostile)
        publisher, and only starts a new baseline (an alternating 2**63-1, 0 would otherwise count
        2**63 each)."""
        last = self._last_index.get(topic)
        self._last_index[topic] = (index, source_skipped)
        if last is None or index == last[0] + 1:
            return
        if last[0] < index <= last[0] + 1 + MAX_GAP:
            self.stats.missed += max(0, index - last[0] - 1 - max(0, source_skipped - last[1]))
        else:
            self.stats.restarts += 1
            log.debug("%s: frame_index %d after %d; counting from here", topic, index, last[0])

    def _count_superseded(self, frames: list[bytes]) -> None:
        """The gap counter hears of an image message dropped undecoded (its header only, bounded)."""
        try:
            header = wire.load_header(bytes(frames[1]), self.limits) if len(frames) > 1 else None
        except wire.WireError:
            return
        if not isinstance(header, dict) or (self.sources is not None and header.get("source_id") not in self.sources):
            return
        index, drops = header.get("frame_index"), header.get("drops")
        skipped = drops.get("source", 0) if isinstance(drops, dict) else 0
        if wire._is_int(index) and wire._is_int(skipped):
            self._count_gap(bytes(frames[0][:80]).decode("ascii", "replace"), index, skipped)

    def _skip(self, error: wire.WireError) -> None:
        self.stats.skipped[error.reason] += 1
        log.debug("skipped a message (%s): %s", error.reason, error)

    def _drain(self) -> None:
        """Take what is queued (up to rcvhwm messages held here: a slow reader's backlog stays bounded by
        the socket, which drops), decode only the newest image message per topic (an older one is
        superseded before it costs a decode: its header alone tells the gap counter), then keep only the
        newest image message per topic among those held."""
        raw: list[list[bytes]] = []
        for _ in range(min(_DRAIN_LIMIT, max(0, self._rcvhwm - len(self._pending)))):
            frames = self._next_raw()
            if frames is None:
                break
            raw.append(frames)
        last = {bytes(frames[0][:80]): i for i, frames in enumerate(raw) if bytes(frames[0][:6]).split(b".")[0]
                in (b"frame", b"seg", b"matte")}
        for i, frames in enumerate(raw):
            if last.get(bytes(frames[0][:80]), i) != i:
                self.stats.superseded += 1
                self._count_superseded(frames)
            else:
                self._handle(frames)
        newest: dict[str, int] = {}
        for i, m in enumerate(self._pending):
            if isinstance(m, (FrameMessage, SegMessage, MatteMessage)):
                newest[m.topic] = i
        if not newest:
            return
        kept: collections.deque[Message] = collections.deque()
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
