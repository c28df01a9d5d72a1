"""What a publisher knows of its subscribers: the prefixes they subscribed to, how many of each
(an XPUB socket with ``XPUB_VERBOSER`` reports every subscribe and unsubscribe, a subscriber
that goes away included), and which picture topics have one subscriber whose queue is full.

A topic's only subscriber with a full queue is not sent to again until a try finds room: after
``FULL_RETRY_S``, then after twice as long each time it is still full, up to
``FULL_RETRY_MAX_S`` (each try of a picture costs an annotation and an encode).
"""

from __future__ import annotations

import collections
import time

FULL_RETRY_S, FULL_RETRY_MAX_S = 0.2, 2.0


class Subscriptions:
    """Subscriber counts per prefix, and the topics whose one subscriber is full (``bytes`` topics)."""

    def __init__(self) -> None:
        self._count: collections.Counter[bytes] = collections.Counter()  # prefix -> subscribers
        self._full: dict[bytes, tuple[float, float]] = {}  # topic -> (next try, wait) of its full subscriber

    def update(self, message: bytes) -> None:
        """One XPUB subscription message: ``\\x01`` + prefix (subscribe) or ``\\x00`` + prefix."""
        prefix = message[1:]
        if message[:1] == b"\x01":
            self._count[prefix] += 1
            self._full.clear()  # a new subscriber: every topic is tried at once
        elif message[:1] == b"\x00":  # a subscriber unsubscribed or went away
            self._count[prefix] -= 1
            if self._count[prefix] <= 0:
                del self._count[prefix]

    def wanted(self, topic: bytes) -> bool:
        """Some subscriber's prefix matches ``topic``."""
        return any(topic.startswith(prefix) for prefix in self._count)

    def subscribers(self, topic: bytes) -> int:
        """Subscriptions matching ``topic`` (a subscriber with two matching prefixes counts twice)."""
        return sum(n for prefix, n in self._count.items() if topic.startswith(prefix))

    def full(self, topic: bytes) -> bool:
        """The topic's one subscriber had a full queue, and its next try has not come."""
        entry = self._full.get(topic)
        return entry is not None and time.monotonic() < entry[0] and self.subscribers(topic) == 1

    def mark_full(self, topic: bytes) -> None:
        """A send to the topic's one subscriber found its queue full: wait before the next try."""
        last = self._full.get(topic)
        wait = FULL_RETRY_S if last is None else min(2 * last[1], FULL_RETRY_MAX_S)
        self._full[topic] = (time.monotonic() + wait, wait)

    def delivered(self, topic: bytes) -> None:
        """A send of the topic went out: its subscriber has room."""
        self._full.pop(topic, None)
