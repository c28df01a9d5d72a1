"""A SUB socket's connections, watched: drops counted, and a connection made again only where libzmq won't.

libzmq reconnects a dropped connection by itself and keeps what it had queued, so an ordinary drop (a
publisher that exited, was killed or restarts) needs nothing from us. The exception is a protocol error,
which is what refusing a frame over ZMQ_MAXMSGSIZE is: libzmq then forgets the connection for good. The
two are told apart by what follows the drop on the monitor: libzmq announces the reconnect it schedules
(EVENT_CONNECT_RETRIED) at once; a drop not followed by one within a grace is made again here.

Making one again takes care: a poll reads the first frame of the next message ahead (ZMQ_EVENTS), and
tearing down the connection that frame came from leaves the rest of it unreadable: libzmq then aborts
the process (``Assertion failed: !_more (src/fq.cpp:80)``). So every whole message the socket holds is
taken out first (at most what its queues can hold), and only then is the endpoint disconnected and
connected again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_RETRYING = zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED
GRACE_S = 0.5  # libzmq announces its own reconnect within microseconds of the drop; this is ample
MAX_PAUSE_S = 5.0  # drops that keep coming (a stream of oversized messages): the wait doubles up to this


@dataclass
class Dropped:
    """One event worth telling the user about: a connection dropped, or a handshake refused."""

    endpoint: str
    handshake_failed: bool = False
    not_authorised: bool = False  # (of a failed handshake) the publisher said its key is not authorised


class ConnectionKeeper:
    """Watches ``sock``'s connections to ``endpoints`` (the list is read, not copied: connect more later).

    Register ``monitor`` in the poller beside the socket; call ``read_events()`` when it is readable,
    ``remake_due(take)`` when ``due_in()`` has passed, and ``received()`` when a message arrived (the
    pause before a reconnect goes back to its first value).
    """

    def __init__(self, sock: zmq.Socket, endpoints: list[str], hwm: int) -> None:
        self._sock = sock
        self._endpoints = endpoints
        self._hwm = max(1, hwm)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED | _RETRYING)
        self._due: dict[str, float] = {}  # endpoint -> when to make it again unless libzmq says it retries
        self._refused: set[str] = set()  # endpoints whose last handshake failed: libzmq retries those itself
        self._pause = GRACE_S
        self.disconnects = 0  # connections dropped, whoever makes them again
        self.remade = 0  # of those, made again here: libzmq would not (a message over the size limit)

    def read_events(self) -> list[Dropped]:
        """Take every pending monitor event; the drops and refused handshakes among them."""
        out: list[Dropped] = []
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            endpoint = event["endpoint"].decode() if isinstance(event["endpoint"], bytes) else event["endpoint"]
            kind = event["event"]
            if endpoint not in self._endpoints:
                continue
            if kind & _RETRYING:
                self._due.pop(endpoint, None)
            elif kind & HANDSHAKE_FAILED:
                self._refused.add(endpoint)
                out.append(Dropped(endpoint, True, bool(kind & zmq.EVENT_HANDSHAKE_FAILED_AUTH)))
            elif kind == zmq.EVENT_DISCONNECTED:
                if endpoint in self._refused:  # the drop after a refused handshake: libzmq retries at its pace
                    self._refused.discard(endpoint)
                    continue
                self.disconnects += 1
                self._due[endpoint] = time.monotonic() + self._pause
                out.append(Dropped(endpoint))
        return out

    def due_in(self) -> float | None:
        """Seconds until a connection libzmq has given up on is made again here; None when none is."""
        return max(0.0, min(self._due.values()) - time.monotonic()) if self._due else None

    def due_ms(self, wait_ms: int | None) -> int | None:
        """``wait_ms`` (a poll's timeout, None: forever) shortened to when a reconnect is due."""
        due = self.due_in()
        if due is None:
            return wait_ms
        due_ms = math.ceil(due * 1000)
        return due_ms if wait_ms is None else min(wait_ms, due_ms)

    def received(self) -> None:
        """A message arrived: connections work, the next reconnect waits the first pause again."""
        self._pause = GRACE_S

    def remake_due(self, take: Callable[[list[bytes]], None]) -> int:
        """Connect again to every endpoint whose time has come, after handing each whole message the
        socket holds to ``take`` (never a half-read one: see the module's docstring). How many were made."""
        now = time.monotonic()
        due = [endpoint for endpoint, at in self._due.items() if at <= now]
        if not due:
            return 0
        for _ in range(self._hwm * (len(self._endpoints) + 1)):  # what the socket's queues can hold
            try:
                take(self._sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        for endpoint in due:
            del self._due[endpoint]
            log.debug("libzmq gave up on %s (a message over the size limit?); connecting again", endpoint)
            try:
                self._sock.disconnect(endpoint)
            except zmq.ZMQError:
                pass  # libzmq may have forgotten it already
            self._sock.connect(endpoint)
            self.remade += 1
        self._pause = min(2 * self._pause, MAX_PAUSE_S)
        return len(due)

    def close(self) -> None:
        """Stop monitoring and close the monitor socket (before the socket itself closes)."""
        if not self._sock.closed:
            self._sock.disable_monitor()
        if not self.monitor.closed:
            self.monitor.close(linger=0)
