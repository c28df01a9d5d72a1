"""ZmqPublisher: the sink that publishes a run's results over ZeroMQ (docs/WIRE.md) on one XPUB socket
for every source (topics ``KIND.<source_id>``), bound before any model loads or connected to a broker's
XSUB side. The messages are built in ``messages.py``, the status sent by ``status.py``, the CURVE keys
read by ``curve.py``.

It never blocks the pipeline: a subscriber's full queue (``sndhwm`` messages) makes a send a counted drop
(a lower bound: with ``isolate_subscribers`` the message goes again, lossy, to the subscribers with room),
which subscribers see as ``frame_index`` gaps. A picture is encoded only for a topic somebody subscribes
to, and not while that topic's one subscriber is full. With CURVE it is the server when it binds (client
keys in ``authorized/``, re-read when an unknown key knocks) and a client of the broker when it connects.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.auth
from sapiens2_client import wire
from sapiens2_client.endpoints import check_endpoint, is_loopback
from sapiens2_client.keys import CurveClientKeys, CurveKeyring, CurveServerKeys
from sapiens2_client.timing import RateMeter
from zmq.auth.thread import ThreadAuthenticator

from stages.mocap.fuse import WorldFrame
from stages.types import FrameResult, StreamInfo

from ..net.monitoring import WARN_EVERY_S, ConnectionWatch
from .jpeg import JpegEncoder
from .messages import RIG_ID, frame_messages, frame_meta, world_message
from .status import PublisherStatus, SourceStatus
from .subscriptions import Subscriptions

log = logging.getLogger(__name__)

__all__ = ["CurveClientKeys", "CurveServerKeys", "JpegEncoder", "PublishError", "ZmqPublisher"]


class PublishError(RuntimeError):
    """The publisher could not be set up (bad endpoint, port in use, missing keys)."""


@dataclass
class PublisherStats:
    """Counters of one publisher, keyed by message kind (all sources together)."""

    frames: int = 0
    sent: dict[str, int] = field(default_factory=lambda: collections.Counter())
    dropped: dict[str, int] = field(default_factory=lambda: collections.Counter())
    encoded: dict[str, int] = field(default_factory=lambda: collections.Counter())


class ZmqPublisher(PublisherStatus):
    """Publishes keypoints, frames (JPEG), seg (PNG), matte (PNG) and status over an XPUB socket.

    endpoint is bound (or connected to a broker's XSUB side when connect=True); a port of ``*``
    picks a free one, read back from ``.endpoint`` after bind(). sndhwm counts queued messages of
    every kind per subscriber (32 = about 8 frames when all four kinds are subscribed). curve:
    the server keys when binding, or the client keys (with the broker's public key) when connecting.
    """

    def __init__(
        self,
        endpoint: str = wire.DEFAULT_ENDPOINT,
        *,
        connect: bool = False,
        header_format: str = "msgpack",
        jpeg_quality: int = 90,
        sndhwm: int = 32,
        isolate_subscribers: bool = True,
        status_interval_s: float = 1.0,
        linger_ms: int = 500,
        curve: CurveServerKeys | CurveClientKeys | None = None,
        gpu_jpeg: bool | str = False,  # True: the current CUDA device; a name: that device
        raw_frames: bool = False,
        announce: str = "publishing",
    ) -> None:
        if header_format not in wire.HEADER_FORMATS:
            raise ValueError(f"header_format must be msgpack or json, got {header_format!r}")
        if not 1 <= jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
        try:
            check_endpoint(endpoint, bind=not connect)
        except ValueError as exc:
            raise PublishError(str(exc)) from None
        if curve is not None and isinstance(curve, CurveClientKeys) != connect:
            raise PublishError("CURVE: a publisher that binds needs the server keys, one that connects to a broker "
                               "the client keys")
        self.requested_endpoint = endpoint
        self.connect = connect
        self.header_format = header_format
        self.jpeg_quality = jpeg_quality
        self.sndhwm = sndhwm
        self.isolate_subscribers = isolate_subscribers
        self.status_interval_s = status_interval_s
        self.linger_ms = linger_ms
        self.curve = curve
        self.jpeg = JpegEncoder(jpeg_quality, gpu_jpeg if isinstance(gpu_jpeg, str) else "auto" if gpu_jpeg else None)
        self.raw_frames = raw_frames  # publish the frame as decoded, without the pipeline's overlays
        self.announce = announce  # what the log line of the bound endpoint says it is
        self.detector: str | None = None  # how persons are found (status messages say it), once the stages are built
        self.stats = PublisherStats()
        self.endpoint = endpoint
        self._sources: dict[str, SourceStatus] = {}
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._auth: ThreadAuthenticator | None = None
        self._lock = threading.Lock()  # guards the socket: write() and the status thread share it
        self._subscriptions = Subscriptions()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch = ConnectionWatch(endpoint, connect, log)  # subscribers, or the broker, from the monitor

    # -- set-up -----------------------------------------------------------------------------
    def bind(self) -> None:
        """Create the socket (and CURVE authenticator) and bind or connect; PublishError when that
        fails. Idempotent; ``open`` calls it when nobody did."""
        if self._sock is not None:
            return
        self._ctx = zmq.Context()
        try:
            sock = self._ctx.socket(zmq.XPUB)
            if isinstance(self.curve, CurveServerKeys):
                self._auth = ThreadAuthenticator(self._ctx)
                self._auth.start()
                self._auth.configure_curve_callback(domain="*", credentials_provider=CurveKeyring(
                    self.curve.authorized_dir, server=f"the publisher on {self.endpoint}", warn_every_s=WARN_EVERY_S))
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe: subscribers are counted
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue makes send raise Again: drops are counted
            sock.setsockopt(zmq.SNDHWM, self.sndhwm)
            sock.setsockopt(zmq.LINGER, self.linger_ms)
            if self.curve is not None:
                self.curve.apply(sock)
            self._monitor = sock.get_monitor_socket(ConnectionWatch.MASK)
            self._sock = sock
            if self.connect:
                sock.connect(self.requested_endpoint)
            else:
                sock.bind(self.requested_endpoint)
                self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self.close()
            verb = "connect to" if self.connect else "bind"
            raise PublishError(
                f"cannot {verb} {self.requested_endpoint}: {e}; choose another endpoint (e.g. tcp://127.0.0.1:*)"
            ) from e
        if not self.connect and self.curve is None and not is_loopback(self.endpoint):
            log.warning("publishing on %s without CURVE: anyone who can reach it reads the stream unencrypted; "
                        "create keys with `sapiens2-stream keys DIR` and pass --curve-dir DIR", self.endpoint)
        self._watch = ConnectionWatch(self.endpoint, self.connect, log)  # the endpoint as bound; before any event
        self._thread = threading.Thread(target=self._status_loop, name="zmq-status", daemon=True)
        self._thread.start()
        log.info("%s on %s%s", self.announce, self.endpoint, " (connecting to a broker)" if self.connect else "")

    # -- Sink protocol ----------------------------------------------------------------------
    def open(self, info: StreamInfo) -> None:
        """Register a source (bind first if needed): its topics are ``KIND.<source_id>``."""
        wire.check_source_id(info.source_id)
        self.bind()
        with self._lock:
            self._sources[info.source_id] = SourceStatus(info, rate=RateMeter(max(self.status_interval_s, 0.5)))

    def write(self, result: FrameResult) -> None:
        """Publish one frame's messages; never blocks (full queues drop and count)."""
        assert self._sock is not None, "open() first"
        frame = result.frame
        src = frame.source_id if frame.source_id in self._sources else next(iter(self._sources))
        source = self._sources[src]
        with self._lock:
            self._poll_subscriptions()
            self.stats.frames += 1
            source.frames += 1
            source.last_index = frame.index
            source.pipeline_drops = dict(result.drops)
            wanted = {k: self._is_subscribed(wire.topic_for(k, src)) for k in ("keypoints", *wire.IMAGE_KINDS)}
            for kind in wire.IMAGE_KINDS:  # its only subscriber is full: no encoding (a counted drop) for now
                if wanted[kind] and self._subscriptions.full(wire.topic_for(kind, src).encode()):
                    wanted[kind] = False
                    self.stats.dropped[kind] += 1
            drops = self._all_drops(source)
        meta = frame_meta(result, src, drops, result.random_weights or source.info.random_weights)
        kinds = [kind for kind, want in wanted.items() if want]
        encoded = [(kind, self._encode(kind, fields, parts))
                   for kind, fields, parts in frame_messages(result, meta, kinds, self.raw_frames)]
        with self._lock:
            for kind, frames in encoded:
                self._send(kind, frames)
            source.rate.tick()

    def write_world(self, world: WorldFrame) -> None:
        """Publish one world step (``world.rig``) if anyone subscribes to it; never blocks."""
        topic = wire.topic_for("world", RIG_ID)
        with self._lock:
            self._poll_subscriptions()
            if self._sock is not None and self._is_subscribed(topic):
                fields, parts = world_message(world)
                self._send("world", self._encode("world", fields, parts))

    def event(self, record: dict[str, Any]) -> None:
        """A source changed health (``{"event": "stalled", "source_id": ..., "time_ns": ...}``):
        publish its status now, with the event."""
        with self._lock:
            source = self._sources.get(str(record.get("source_id")))
            if source is None:
                return
            source.health = {"resumed": "ok"}.get(record["event"], record["event"])
            self._publish_status(source, record)

    def close_source(self, source_id: str) -> None:
        """A source ended, failed or was removed while others run on: its last status says ``closed``
        now (not when the whole run ends), and no status follows."""
        with self._lock:
            source = self._sources.pop(source_id, None)
            if source is not None and self._sock is not None:
                source.health = "closed"
                self._publish_status(source)

    def close(self) -> None:
        """Stop the status thread, send a last status per source, close sockets with bounded linger."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 2 * self.status_interval_s))
            self._thread = None
            if self.connect and not self._watch.broker_ever:
                log.warning("no broker ever answered at %s: nothing this run published reached a subscriber",
                            self.endpoint)
        if self._sock is not None:
            with self._lock:
                for source in self._sources.values():
                    source.health = "closed"
                    self._publish_status(source)
                self._sock.disable_monitor()
                self._sock.close(linger=self.linger_ms)
                self._sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- public helpers -----------------------------------------------------------------------
    @property
    def connections(self) -> int:
        """Open ZeroMQ connections: subscribers, or the broker when connecting."""
        return self._watch.connections

    def set_health(self, health: str, source_id: str | None = None) -> None:
        """Set the health reported in status ("ok", "stalled", "reconnecting", ...) of a source (all: None)."""
        for sid, source in self._sources.items():
            if source_id is None or sid == source_id:
                source.health = str(health)

    def subscribed(self, topic: str) -> bool:
        """Whether some subscriber's prefix matches topic (reads pending subscription messages)."""
        with self._lock:
            self._poll_subscriptions()
            return self._is_subscribed(topic)

    def wants(self, topic: str) -> bool:
        """Whether a message of ``topic`` would be encoded now: subscribed, and not a picture topic
        whose one subscriber's queue is full (its picture need not even be drawn)."""
        with self._lock:
            self._poll_subscriptions()
            return self._is_subscribed(topic) and not self._subscriptions.full(topic.encode())

    def wait_for_subscriber(self, topic: str, timeout_s: float) -> bool:
        """Wait up to timeout_s until some subscriber's prefix matches topic."""
        deadline = time.monotonic() + timeout_s
        while not self.subscribed(topic):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- internals (callers hold self._lock where a socket is touched) --------------------------
    def _encode(self, kind: str, fields: dict, parts: list[wire.Part]) -> list[bytes]:
        """The message's frames; a frame message's JPEG from the GPU encoder when it is on and works."""
        encoded_parts: tuple[tuple[dict, bytes], ...] = ()
        if kind == "frame":
            image = parts[0].array
            data = self.jpeg.encode(image)
            if data is not None:
                parts, encoded_parts = [], ((wire.image_descriptor("image", "jpeg", image.shape), data),)
        self.stats.encoded[kind] += 1
        return wire.encode(kind, fields["source_id"], fields, parts, publish_ns=time.time_ns(),
                           header_format=self.header_format, jpeg_quality=self.jpeg_quality,
                           encoded_parts=encoded_parts)

    def _poll_subscriptions(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                msg = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._subscriptions.update(msg)

    def _is_subscribed(self, topic: str) -> bool:
        return self._subscriptions.wanted(topic.encode())

    def _send(self, kind: str, frames: list[bytes]) -> bool:
        """Send without blocking; False (and a counted drop) when some subscriber's queue is full."""
        sock = self._sock
        if sock is None:
            return False
        topic = bytes(frames[0])
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats.dropped[kind] += 1
            if self._subscriptions.subscribers(topic) == 1:
                # Its one subscriber is full: nobody to resend to. (A lossy send would also make libzmq
                # set that subscriber aside and report later sends as done, so its fullness would no
                # longer show.) Its pictures are not even encoded until the next try.
                if kind in wire.IMAGE_KINDS:
                    self._subscriptions.mark_full(topic)
                return False
            if not self.isolate_subscribers:
                return False
            sock.setsockopt(zmq.XPUB_NODROP, 0)  # lossy: still reach the subscribers with room
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:  # pragma: no cover - lossy XPUB sends do not raise Again
                pass
            finally:
                sock.setsockopt(zmq.XPUB_NODROP, 1)
            return False
        self.stats.sent[kind] += 1
        self._subscriptions.delivered(topic)
        return True

    def _all_drops(self, source: SourceStatus) -> dict[str, int]:
        own = {f"publish_{k}": int(v) for k, v in self.stats.dropped.items()}
        return {**{str(k): int(v) for k, v in source.pipeline_drops.items()}, **own}

