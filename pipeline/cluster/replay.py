"""Reading keypoints back from Redis Streams through a consumer group, at least once.

``StreamConsumer`` (and ``replay``) hand out first this consumer's pending entries (given to it
earlier and never acknowledged: a killed run's), then new ones, and acknowledge each entry once the
caller has handled it. The entries are the bridge's (pipeline.cluster.streams); docs/REDIS_STREAMS.md
is the user's guide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sapiens2_client import wire
from sapiens2_client.messages import Message

from .prerequisites import need
from .streams import connect, decode_entry

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One stream entry handed to a consumer: its stream, id and decoded message."""

    stream: str
    id: str
    message: Message
    redelivered: bool  # it was delivered to this consumer before and never acknowledged


@dataclass
class ConsumerStats:
    """What a StreamConsumer handed out and what it had to skip."""

    delivered: int = 0
    redelivered: int = 0
    bad: int = 0  # entries that did not decode: acknowledged and skipped
    trimmed: int = 0  # pending entries MAXLEN removed before they were acknowledged (lost)


class StreamConsumer:
    """Reads one stream through a Redis consumer group, at least once.

    The group is created when missing (``start``: "0" = everything the stream still holds, "$" =
    only entries added from now on). Iterating yields first this consumer's pending entries (given to
    it earlier, never acknowledged: a killed run's), then new ones, and acknowledges each entry when
    the caller asks for the next: an entry whose handling crashed the caller is delivered again.
    ``timeout_s`` ends the iteration after that long without a new entry (None: never). ``client`` is
    a URL or a redis.Redis whose socket timeout is longer than ``block_ms``.
    """

    def __init__(self, client: redis.Redis | str, stream: str, group: str, consumer: str, *, start: str = "0",
                 count: int = 64, block_ms: int = 1000, timeout_s: float | None = None,
                 limits: wire.Limits | None = None) -> None:
        self.redis = connect(client, socket_timeout_s=block_ms / 1000 + 5.0) if isinstance(client, str) else client
        self._own = isinstance(client, str)
        self._errors = need("redis.exceptions", "StreamConsumer")
        self.stream, self.group, self.consumer, self.start = stream, group, consumer, start
        self.count, self.block_ms, self.timeout_s = count, block_ms, timeout_s
        self.limits = limits or wire.Limits()
        self.stats = ConsumerStats()
        self._cursor: str | None = "0"  # position in our pending list; None once it has been read
        self.ensure_group()

    def ensure_group(self) -> bool:
        """Create the group (and the stream) when missing; True when it was created."""
        try:
            self.redis.xgroup_create(self.stream, self.group, id=self.start, mkstream=True)
        except self._errors.ResponseError as e:
            if "BUSYGROUP" in str(e):
                return False
            raise
        return True

    def read(self) -> list[Entry]:
        """The next entries: pending ones while any are left, then new ones (waits up to block_ms).

        Redis errors reach the caller; after a lost connection the next read starts with the pending
        entries again, so whatever the broken reply carried is delivered, not lost.
        """
        while True:
            pending = self._cursor is not None
            try:
                reply = self.redis.xreadgroup(self.group, self.consumer, {self.stream: self._cursor or ">"},
                                              count=self.count, block=None if pending else self.block_ms)
            except self._errors.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                log.warning("group %s of %s is gone (Redis restarted without persistence?); creating it again",
                            self.group, self.stream)
                self.ensure_group()
                continue
            except (self._errors.ConnectionError, self._errors.TimeoutError):
                self._cursor = "0"
                raise
            rows = reply[0][1] if reply else []
            if not pending:
                return self._entries(rows, redelivered=False)
            if not rows:  # the pending list is read: from now on, new entries
                self._cursor = None
                continue
            self._cursor = rows[-1][0].decode()
            entries = self._entries(rows, redelivered=True)
            if entries:
                return entries

    def ack(self, *ids: str) -> int:
        """Acknowledge entries by id: they are done and never delivered again."""
        return int(self.redis.xack(self.stream, self.group, *ids)) if ids else 0

    def __iter__(self) -> Iterator[Entry]:
        idle_since = time.monotonic()
        while True:
            entries = self.read()
            if not entries:
                if self.timeout_s is not None and time.monotonic() - idle_since >= self.timeout_s:
                    return
                continue
            for entry in entries:
                yield entry  # the caller handles it; asking for the next acknowledges it
                self.ack(entry.id)
            idle_since = time.monotonic()

    def close(self) -> None:
        if self._own:
            self.redis.close()

    def __enter__(self) -> StreamConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _entries(self, rows: list, redelivered: bool) -> list[Entry]:
        """Decode XREADGROUP rows; acknowledge (and count) those that cannot be delivered."""
        entries, skipped, trimmed = [], [], 0
        for raw_id, fields in rows:
            entry_id = raw_id.decode()
            if not fields:  # a pending entry that MAXLEN trimmed before it was acknowledged
                trimmed += 1
                skipped.append(entry_id)
                continue
            try:
                message = decode_entry(fields, self.limits)
            except wire.WireError as e:
                self.stats.bad += 1
                skipped.append(entry_id)
                log.warning("skipping entry %s of %s (%s): %s", entry_id, self.stream, e.reason, e)
                continue
            entries.append(Entry(self.stream, entry_id, message, redelivered))
        if skipped:
            self.ack(*skipped)
        if trimmed:
            self.stats.trimmed += trimmed
            log.warning("%d pending entries of %s were trimmed by MAXLEN before they were handled: lost", trimmed,
                        self.stream)
        self.stats.delivered += len(entries)
        self.stats.redelivered += len(entries) if redelivered else 0
        return entries


def replay(url: str, stream: str, group: str, consumer: str, **options: Any) -> Iterator[Entry]:
    """Iterate ``stream`` as ``consumer`` of ``group`` (see StreamConsumer), closing the connection at the end."""
    with StreamConsumer(url, stream, group, consumer, **options) as reader:
        yield from reader
