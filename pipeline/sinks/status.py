"""The status side of ZmqPublisher (pipeline.sinks.publisher): what each source's status reports
(``SourceStatus``), its message, and the ``zmq-status`` thread, which sends every source's status every
``status_interval_s`` even when the pipeline stalls and hands the socket monitor's events to the
connection watch (subscribers, failed handshakes, a broker lost or never there after ``BROKER_WAIT_S``).
A mixin: the publisher holds the socket, its lock, the sources, the stop event, the watch and the monitor."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from sapiens2_client import wire
from sapiens2_client.timing import RateMeter
from zmq.utils.monitor import recv_monitor_message

from stages.types import StreamInfo

from .messages import status_fields

BROKER_WAIT_S = 5.0  # --publish-connect: how long without a broker before saying so


@dataclass
class SourceStatus:
    """What the status of one source reports."""

    info: StreamInfo
    health: str = "ok"
    frames: int = 0
    last_index: int = -1
    pipeline_drops: dict[str, int] = field(default_factory=dict)
    rate: RateMeter = field(default_factory=RateMeter)


class PublisherStatus:
    """``_publish_status``, ``_status_loop`` and ``_watch_monitor`` of ZmqPublisher."""

    def _publish_status(self, source: SourceStatus, event: dict[str, Any] | None = None) -> None:
        info = source.info
        if self._sock is None:
            return
        self._poll_subscriptions()
        topic = wire.topic_for("status", info.source_id)
        if not self._is_subscribed(topic):
            return
        fields = status_fields(info, fps=source.rate.rate, health=source.health, frames=source.frames,
                               last_frame_index=source.last_index, drops=self._all_drops(source),
                               sent=dict(self.stats.sent), uptime_s=time.monotonic() - source.rate.started,
                               detector=self.detector, event=event)
        self._send("status", self._encode("status", fields, []))

    def _status_loop(self) -> None:
        next_status = time.monotonic() + self.status_interval_s
        while not self._stop.is_set():
            self._watch_monitor(min(0.1, self.status_interval_s))
            self._watch.check_broker(BROKER_WAIT_S)
            if time.monotonic() >= next_status:
                next_status += self.status_interval_s
                with self._lock:
                    for source in list(self._sources.values()):
                        self._publish_status(source)

    def _watch_monitor(self, timeout_s: float) -> None:
        """Hand the socket monitor's events to the connection watch (connections, handshakes, the broker)."""
        monitor = self._monitor
        if monitor is None:
            self._stop.wait(timeout_s)
            return
        if not monitor.poll(int(timeout_s * 1000)):
            return
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: all read (or the monitor is closing)
                return
            self._watch.on_event(event["event"])
