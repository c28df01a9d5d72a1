"""Durable keypoints in Redis Streams: the ``bridge`` command (the reader: replay.py).

The bridge subscribes at a broker's XPUB side (or at one pipeline), checks every message with the
client's decoder and appends it to the stream ``{prefix}:{kind}:{source_id}`` (``XADD ... MAXLEN ~ N``):
field ``wire`` holds the raw multipart frames (a msgpack array of byte strings that ``sapiens2_client.wire``
decodes as if off the socket), beside a few plain fields for redis-cli. Messages over
``max_message_bytes`` are refused while they arrive (the connection is made again); messages the
decoder refuses are counted by reason and skipped. While Redis is away the bridge keeps its
subscription, counts what arrives as dropped and retries with a growing pause.
:class:`pipeline.cluster.replay.StreamConsumer` reads the streams back through a consumer group, at
least once. Keys, fields and delivery: docs/REDIS_STREAMS.md.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from sapiens2_client import wire
from sapiens2_client.connection import ConnectionKeeper
from sapiens2_client.endpoints import check_endpoint
from sapiens2_client.keys import CurveClientKeys, KeysError
from sapiens2_client.messages import KeypointsMessage, Message, StatusMessage, decode_message

from .prerequisites import need

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "sapiens2"
DEFAULT_MAXLEN = 100_000
DEFAULT_MAX_SOURCES = 1024
TOPICS = ("keypoints", "status")  # status carries a source's events (stalled, reconnecting, resumed)
WIRE_FIELD = b"wire"
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")  # no glob characters: list_streams matches on it
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")
_BATCH = 256  # messages drained from the socket into one Redis pipeline
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 5.0  # Redis outages
_OUTAGE_LOG_EVERY_S = 30.0


class StreamsError(RuntimeError):
    """Redis cannot be used as given (a bad URL, a server that does not answer) or a bad bridge setting."""


# -- keys and entries ------------------------------------------------------------------------
def check_prefix(prefix: str) -> str:
    """Return prefix if it can start a stream key, else raise StreamsError."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise StreamsError(f"prefix {prefix!r} must be 1-64 characters of letters, digits, '_', '-', '.' or ':'")
    return prefix


def stream_key(prefix: str, kind: str, source_id: str) -> str:
    """``{prefix}:{kind}:{source_id}``; the source id is bounded as in topics (1-64 of [A-Za-z0-9_:-])."""
    return f"{check_prefix(prefix)}:{kind}:{wire.check_source_id(source_id)}"


def entry_fields(frames: Sequence[bytes], message: Message) -> dict[bytes, Any]:
    """The fields of one stream entry: the raw frames (``wire``) and plain fields for people and tools."""
    fields: dict[bytes, Any] = {WIRE_FIELD: msgpack.packb([bytes(f) for f in frames], use_bin_type=True)}
    if isinstance(message, StatusMessage):
        fields.update({b"kind": b"status", b"source": message.source_id, b"health": message.health})
        event = message.header.get("event")
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            fields[b"event"] = event["event"][:64]
        return fields
    kind = message.topic.split(".", 1)[0]
    fields.update({b"kind": kind, b"source": message.meta.source_id, b"frame_index": message.meta.frame_index,
                   b"capture_ns": message.meta.capture_ns})
    if isinstance(message, KeypointsMessage):
        fields[b"persons"] = len(message.boxes)
    return fields


def decode_entry(fields: dict[bytes, bytes], limits: wire.Limits | None = None) -> Message:
    """The message of a stream entry; raises wire.WireError for an entry that is not one (treat it as hostile)."""
    limits = limits or wire.Limits()
    packed = fields.get(WIRE_FIELD)
    if not isinstance(packed, bytes):
        raise wire.WireError("stream entry has no 'wire' field", "frames")
    if len(packed) > limits.max_message_bytes + 16 * (limits.max_parts + 2):  # msgpack adds <= 5 bytes a frame
        raise wire.MessageTooLarge(f"stream entry of {len(packed)} bytes exceeds the "
                                   f"{limits.max_message_bytes}-byte limit")
    try:
        frames = msgpack.unpackb(packed, raw=False, max_bin_len=limits.max_message_bytes,
                                 max_array_len=limits.max_parts + 2, max_str_len=0, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise wire.WireError(f"the entry's 'wire' field is not a msgpack array of frames: {e}", "frames") from None
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise wire.WireError("the entry's 'wire' field must be an array of byte strings", "frames")
    return decode_message(frames, limits)


# -- Redis -----------------------------------------------------------------------------------
def redacted(url: str) -> str:
    """The URL without its password (``user:password@`` or ``?password=``), fit for logs and error lines."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed [ in the host: nothing can be shown safely
        return "<unparsable URL>"
    if parts.password is not None:
        url = url.replace(parts.netloc, f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}", 1)
    return _QUERY_PASSWORD.sub(r"\1***", url)


def connect(url: str, *, socket_timeout_s: float = 5.0) -> redis.Redis:
    """A client for ``url`` that answered PING; StreamsError naming the problem otherwise.

    redis-py's own retries are off: a pipeline it resent after a broken reply could store entries
    twice. (A pooled connection that a Redis restart closed is noticed and renewed when it is taken
    from the pool.) The bridge and the consumer handle outages themselves.
    """
    redis = need("redis", "Redis Streams")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    safe = redacted(url) if isinstance(url, str) else repr(url)
    example = "write it as redis://HOST:PORT/DB (rediss:// for TLS, unix:///path.sock)"
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("not a redis://, rediss:// or unix:// URL")
        if parts.scheme != "unix":
            if parts.port == 0:  # .port raises ValueError for one that is not 0..65535
                raise ValueError("port 0 cannot be reached")
            if parts.path.strip("/") and not parts.path.strip("/").isdigit():
                raise ValueError(f"database {parts.path.strip('/')!r} is not a number")
        client = redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=3.0,
                                      retry=Retry(NoBackoff(), 0))
    except (TypeError, ValueError) as e:
        raise StreamsError(f"bad Redis URL {safe!r}: {e}; {example}") from None
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise StreamsError(f"Redis at {safe} refused the login ({e}); check the user and password in the URL") from None
    except redis.RedisError as e:
        raise StreamsError(f"Redis at {safe} does not answer ({e}); start redis-server there or pass "
                           f"--redis URL") from None
    return client


def list_streams(client: redis.Redis, prefix: str = DEFAULT_PREFIX, kind: str = "keypoints") -> list[str]:
    """The stream keys ``{prefix}:{kind}:*`` (one per source), sorted."""
    match = f"{check_prefix(prefix)}:{kind}:*"
    return sorted(k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(match=match, _type="stream"))


# -- the bridge ------------------------------------------------------------------------------
@dataclass
class BridgeStats:
    """What the bridge stored, refused and lost."""

    stored: int = 0  # entries Redis confirmed
    bad: collections.Counter = field(default_factory=collections.Counter)  # reason -> messages refused
    dropped: int = 0  # messages not stored: Redis was away (or refused the write)
    disconnects: int = 0  # broker connections dropped (e.g. an oversized message) and made again

    def line(self) -> str:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(self.bad.items()))
        return (f"stored {self.stored}, bad {sum(self.bad.values())}{f' ({reasons})' if reasons else ''}, "
                f"dropped {self.dropped}, disconnects {self.disconnects}")


class Bridge:
    """Subscribes at ``endpoint`` and appends each valid message to its source's Redis Stream.

    Redis is reached (PING) in the constructor, before any socket exists, so a bad URL or a dead
    server fails at once with StreamsError. ``run(stop)`` receives until the event is set.
    """

    def __init__(
        self,
        endpoint: str = wire.BROKER_XPUB,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        topics: Sequence[str] = ("keypoints",),
        prefix: str = DEFAULT_PREFIX,
        maxlen: int = DEFAULT_MAXLEN,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
        max_sources: int = DEFAULT_MAX_SOURCES,
        curve: CurveClientKeys | None = None,
        rcvhwm: int = 1000,
    ) -> None:
        unknown = [t for t in topics if t not in TOPICS]
        if unknown or not topics:
            raise StreamsError(f"topic {unknown[0] if unknown else None!r}: the bridge stores {' and '.join(TOPICS)}")
        for name, value in (("maxlen", maxlen), ("max_message_bytes", max_message_bytes),
                            ("max_sources", max_sources)):
            if not isinstance(value, int) or value < 1:
                raise StreamsError(f"{name} must be a positive integer, got {value!r}")
        try:
            check_endpoint(endpoint, bind=False)
        except ValueError as e:
            raise StreamsError(str(e)) from None
        self.endpoint, self.url, self.prefix, self.maxlen = endpoint, redacted(redis_url), check_prefix(prefix), maxlen
        self.topics = tuple(dict.fromkeys(topics))
        self.max_sources = max_sources
        self.limits = wire.Limits(max_message_bytes=max_message_bytes)
        self.stats = BridgeStats()
        self._redis = connect(redis_url)
        self._errors = need("redis", "bridge").RedisError
        self._keys: dict[tuple[str, str], str] = {}  # (kind, source) -> stream key
        self._warned: set[str] = set()
        self._down_since: float | None = None  # monotonic time Redis stopped answering
        self._retry_at = self._pause = 0.0
        self._outage_dropped, self._outage_logged = 0, 0.0
        self._disconnect_logged = self._handshake_logged = -_OUTAGE_LOG_EVERY_S
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # refused while arriving, never buffered
        if curve is not None:
            curve.apply(self._sock)
        for topic in self.topics:
            self._sock.setsockopt(zmq.SUBSCRIBE, f"{topic}.".encode())
        self._watch = ConnectionKeeper(self._sock, [endpoint], rcvhwm)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._watch.monitor, zmq.POLLIN)
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise StreamsError(f"cannot connect to {endpoint!r}: {e}") from None

    def run(self, stop: threading.Event) -> BridgeStats:
        """Store messages until ``stop`` is set; returns the counters."""
        while not stop.is_set():
            ready = dict(self._poller.poll(self._watch.due_ms(100)))
            if self._watch.monitor in ready:
                self._watch_connection()
            held: list[list[bytes]] = []  # what the socket held when a connection libzmq gave up is made again
            if self._watch.remake_due(held.append):
                self._store([e for e in map(self._entry, held) if e is not None])
            if self._sock in ready:
                self._store(self._receive_batch())
        if self._down_since is not None:
            log.warning("Redis was still away at exit: %d messages dropped during this outage", self._outage_dropped)
        return self.stats

    def close(self) -> None:
        """Close the socket (no linger), the context and the Redis connections."""
        self._watch.close()
        if not self._sock.closed:
            self._sock.close(linger=0)
        if not self._ctx.closed:
            self._ctx.term()
        self._redis.close()

    # -- receiving --------------------------------------------------------------------------
    def _receive_batch(self) -> list[tuple[str, dict[bytes, Any]]]:
        batch = []
        for _ in range(_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._watch.received()  # the connection works
            entry = self._entry(frames)
            if entry is not None:
                batch.append(entry)
        return batch

    def _entry(self, frames: list[bytes]) -> tuple[str, dict[bytes, Any]] | None:
        try:
            message = decode_message(frames, self.limits)
        except wire.WireError as e:
            return self._refuse(e.reason, str(e))
        kind = message.topic.split(".", 1)[0]
        source = message.source_id if isinstance(message, StatusMessage) else message.meta.source_id
        key = self._keys.get((kind, source))
        if key is None:
            if len(self._keys) >= self.max_sources:
                return self._refuse("sources", f"{kind}.{source} would be stream number {len(self._keys) + 1}, "
                                               f"over --max-sources {self.max_sources}")
            key = self._keys[(kind, source)] = stream_key(self.prefix, kind, source)
        return key, entry_fields(frames, message)

    def _refuse(self, reason: str, why: str) -> None:
        self.stats.bad[reason] += 1
        if reason not in self._warned:  # once per reason: a flood of garbage must not flood the log
            self._warned.add(reason)
            log.warning("skipping a message (%s): %s; further ones are only counted", reason, why)
        return None

    def _watch_connection(self) -> None:
        """Note dropped connections (libzmq makes them again, or the watch does where libzmq gives up: after
        an oversized message) and refused CURVE handshakes, in a line per kind every _OUTAGE_LOG_EVERY_S."""
        now = time.monotonic()
        for dropped in self._watch.read_events():
            if dropped.handshake_failed:
                if now - self._handshake_logged >= _OUTAGE_LOG_EVERY_S:
                    self._handshake_logged = now
                    log.warning("%s refused the handshake: does it use CURVE (pass --keys DIR --client-name NAME), "
                                "and is this client's key in its authorized/?", self.endpoint)
            elif now - self._disconnect_logged >= _OUTAGE_LOG_EVERY_S:  # a stream of oversized messages: one line
                self._disconnect_logged = now
                log.warning("connection to %s dropped (the broker went away, or a message over the size limit); "
                            "connecting again (%d times so far)", self.endpoint, self._watch.disconnects)
        self.stats.disconnects = self._watch.disconnects

    # -- storing ----------------------------------------------------------------------------
    def _store(self, batch: list[tuple[str, dict[bytes, Any]]]) -> None:
        if not batch:
            return
        if self._down_since is not None and time.monotonic() < self._retry_at:
            self._lost(len(batch))
            return
        pipe = self._redis.pipeline(transaction=False)
        for key, fields in batch:
            pipe.xadd(key, fields, maxlen=self.maxlen, approximate=True)
        try:
            results = pipe.execute(raise_on_error=False)
        except self._errors as e:
            self._outage(e, len(batch))
            return
        refused = [r for r in results if isinstance(r, Exception)]
        self.stats.stored += len(results) - len(refused)
        if refused:  # e.g. OOM (maxmemory) or WRONGTYPE: a key of that name holds something else
            self.stats.dropped += len(refused)
            log.warning("Redis refused %d of %d entries: %s", len(refused), len(results), refused[0])
        if self._down_since is not None:
            log.warning("Redis at %s answers again after %.1f s; %d messages were dropped meanwhile", self.url,
                        time.monotonic() - self._down_since, self._outage_dropped)
            self._down_since = None

    def _outage(self, error: Exception, n: int) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since, self._pause, self._outage_dropped, self._outage_logged = now, _RETRY_FIRST_S, 0, now
            log.warning("Redis at %s does not answer (%s): dropping messages until it does, retrying with backoff",
                        self.url, error)
        else:
            self._pause = min(2 * self._pause, _RETRY_MAX_S)
        self._retry_at = now + self._pause
        self._lost(n)

    def _lost(self, n: int) -> None:
        self.stats.dropped += n
        self._outage_dropped += n
        now = time.monotonic()
        if self._down_since is not None and now - self._outage_logged >= _OUTAGE_LOG_EVERY_S:
            self._outage_logged = now
            log.warning("Redis at %s still away after %.0f s: %d messages dropped so far", self.url,
                        now - self._down_since, self._outage_dropped)


# -- the command -----------------------------------------------------------------------------
def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bridge``."""
    p = subparsers.add_parser("bridge", help="store keypoint messages from a broker in Redis Streams (durable, "
                                             "replayable with consumer groups)")
    p.add_argument("--endpoint", default=wire.BROKER_XPUB, help="the broker's XPUB endpoint (or a pipeline's "
                                                               f"--publish endpoint); default {wire.BROKER_XPUB}")
    p.add_argument("--redis", default=DEFAULT_REDIS_URL, metavar="URL",
                   help=f"Redis URL, redis://[user:password@]HOST:PORT/DB (rediss:// for TLS); default "
                        f"{DEFAULT_REDIS_URL}")
    p.add_argument("--maxlen", type=int, default=DEFAULT_MAXLEN,
                   help="keep about this many entries per stream (XADD MAXLEN ~ N)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="stream keys are PREFIX:KIND:SOURCE")
    p.add_argument("--topic", action="append", choices=TOPICS,
                   help="message kind to store (repeatable; default keypoints; status carries the sources' events)")
    p.add_argument("--keys", help="CURVE keys directory (from `keys`) when the broker uses CURVE")
    p.add_argument("--client-name", default="client", help="client key name inside --keys")
    p.add_argument("--max-message-mb", type=float, default=64.0, help="refuse larger messages")
    p.add_argument("--max-sources", type=int, default=DEFAULT_MAX_SOURCES,
                   help="refuse messages that would open more streams than this (hostile source ids)")
    p.set_defaults(func=cmd_bridge)


def cmd_bridge(args: argparse.Namespace) -> int:
    need("redis", "bridge")
    try:
        curve = CurveClientKeys.from_dir(args.keys, args.client_name) if args.keys else None
        bridge = Bridge(args.endpoint, args.redis, topics=args.topic or ["keypoints"], prefix=args.prefix,
                        maxlen=args.maxlen, max_message_bytes=int(args.max_message_mb * 2**20),
                        max_sources=args.max_sources, curve=curve)
    except (StreamsError, KeysError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"bridge: {bridge.endpoint} -> {bridge.url} "
          f"({', '.join(f'{bridge.prefix}:{t}:<source>' for t in bridge.topics)}, MAXLEN ~ {bridge.maxlen})",
          flush=True)
    try:
        stats = bridge.run(stop)
    finally:
        bridge.close()
    print(f"bridge: {stats.line()}", flush=True)
    return 0
