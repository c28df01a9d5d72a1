"""What ZeroMQ socket monitors tell about connections, said in the log without flooding it.

``Throttle`` rate-limits a repeated warning (a misconfigured client retries its handshake every few
hundred milliseconds). ``ConnectionWatch`` follows a publisher's socket: it counts connections,
warns about failed handshakes and, when the publisher connects to a broker, says when the broker
answers (its handshake succeeded), when it is lost, when it answers again, and when none has
answered for a while.
"""

from __future__ import annotations

import logging
import time

import zmq

log = logging.getLogger(__name__)

WARN_EVERY_S = 10.0
HANDSHAKE_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed (protocol: no or wrong CURVE keys?)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused by CURVE authentication",
}


class Throttle:
    """At most one warning every ``every_s``: ``due()`` is None while quiet (the occurrence is
    counted), else the suffix that says how many were not warned about."""

    def __init__(self, every_s: float = WARN_EVERY_S) -> None:
        self.every_s = every_s
        self._last, self._since = 0.0, 0

    def due(self) -> str | None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._since += 1
            return None
        more = f" ({self._since} more since the last warning)" if self._since else ""
        self._last, self._since = now, 0
        return more


class ConnectionWatch:
    """A publisher's connections, from its socket monitor's events (``on_event``); ``MASK`` is what
    to monitor. Connecting to a broker, the broker counts as there once its handshake succeeded."""

    MASK = (sum(HANDSHAKE_FAILED) | zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED)

    def __init__(self, endpoint: str, connect: bool, logger: logging.Logger = log) -> None:
        self.endpoint, self.connect, self.log = endpoint, connect, logger
        self.connections = 0  # open ZeroMQ connections (subscribers, or the broker when connecting)
        self.broker_ever = False  # a broker's handshake succeeded at least once
        self._broker_up, self._broker_down_since, self._broker_warned = False, time.monotonic(), False
        self._handshakes = Throttle()

    def on_event(self, event: int) -> None:
        if event in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
            self.connections += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self.connections = max(0, self.connections - 1)
        if self.connect:
            self._on_broker_event(event)
        what = HANDSHAKE_FAILED.get(event)
        more = self._handshakes.due() if what is not None else None
        if more is not None:
            whose = "the broker's handshake at" if self.connect else "a subscriber's handshake on"
            self.log.warning("%s %s %s%s", whose, self.endpoint, what, more)

    def check_broker(self, wait_s: float) -> None:
        """Say once when no broker has answered for ``wait_s``, at the start or after it was lost
        (ZeroMQ keeps trying, silently, and publishes nothing meanwhile)."""
        if not self.connect or self._broker_up or self._broker_warned:
            return
        if time.monotonic() - self._broker_down_since >= wait_s:
            self._broker_warned = True
            self.log.warning("no broker answers at %s after %.0f s: nothing is published until one does (ZeroMQ "
                        "keeps trying); is `sapiens2-stream broker` running there, with these CURVE keys?",
                        self.endpoint, wait_s)

    def _on_broker_event(self, event: int) -> None:
        now = time.monotonic()
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not self._broker_up:
            if self.broker_ever:
                self.log.warning("the broker at %s answers again after %.1f s", self.endpoint,
                            now - self._broker_down_since)
            else:
                say = self.log.warning if self._broker_warned else self.log.info
                say("connected to the broker at %s", self.endpoint)
            self._broker_up, self.broker_ever = True, True
        elif event == zmq.EVENT_DISCONNECTED and self._broker_up:
            self._broker_up, self._broker_down_since, self._broker_warned = False, now, False
            self.log.warning("lost the broker at %s: nothing is published until it answers again (ZeroMQ reconnects)",
                        self.endpoint)
