"""Where finished frames go; every sink of a run is built by ``pipeline.sinks.build.build_outputs``.

The protocol: ``open(info)`` once per source; ``write(result)`` for every finished FrameResult, in
order, from one thread; ``close()`` always, in a ``finally``. Optional: ``write_world(world)`` (a
motion-capture step), ``event(record)`` (a source's health changed), ``close_source(source_id)``,
``uses_image`` (it needs the annotated picture), ``path`` with ``frames_written`` or ``lines_written``
(named in the run's summary). ``PerSource`` gives each source a sink of its own.

What each keeps when the process dies before ``close``: ``VideoRecorder`` a playable file of all but
the last ``--record-fragment-s`` and its queue; ``KeypointWriter`` and ``WorldWriter`` every whole line (a write cut
short is cut back to the last whole one); ``TrcExport`` no TRC (written at close), its world spool
as above; ``ZmqPublisher``, ``PreviewWindow`` and ``MetricsSink`` nothing to keep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from stages.types import FrameResult, StreamInfo

log = logging.getLogger(__name__)


class Sink(Protocol):
    def open(self, info: StreamInfo) -> None: ...

    def write(self, result: FrameResult) -> None: ...

    def close(self) -> None: ...


class PerSource:
    """A sink of its own for each source, made by ``factory(info)`` when the source opens (one
    recording per camera); frames, events and closing go to the sink of their source."""

    def __init__(self, factory: Callable[[StreamInfo], Sink], uses_image: bool = False) -> None:
        self.factory = factory
        self.uses_image = uses_image  # its sinks need the annotated picture (recordings, previews)
        self.sinks: dict[str, Sink] = {}
        self.finished: list[Sink] = []  # the sinks of sources that ended or were removed, closed
        self._close_error: Exception | None = None  # the first of those that failed to close

    def open(self, info: StreamInfo) -> None:
        sink = self.factory(info)
        sink.open(info)
        self.sinks[info.source_id] = sink

    def write(self, result: FrameResult) -> None:
        self.sinks[result.frame.source_id].write(result)

    def event(self, record: dict[str, Any]) -> None:
        handler = getattr(self.sinks.get(str(record.get("source_id"))), "event", None)
        if handler is not None:
            handler(record)

    def close_source(self, source_id: str) -> None:
        """Finish one source's sink (it ended or was removed). A failure is logged and the other
        sources run on; close() raises it at the end, so the run still exits non-zero."""
        sink = self.sinks.pop(source_id, None)
        if sink is not None:
            self.finished.append(sink)
            try:
                sink.close()
            except Exception as exc:
                log.error("closing the output of %s failed: %s", source_id, exc)
                self._close_error = self._close_error or exc

    def close(self) -> None:
        """Close every source's sink; the first failure is raised after all were tried."""
        error = self._close_error
        for sink in self.sinks.values():
            try:
                sink.close()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
