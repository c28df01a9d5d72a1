"""The sink thread of a run: what reaches it (finished frames, source events, step ends) and what it
counts (``RunStats``). It annotates a frame only when a sink wants the picture, calls every sink in
order, and turns a step's end into a world step for the sinks that take one."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from sapiens2_client.timing import RateMeter

from pipeline.sinks import Sink
from stages.annotate import Annotator
from stages.types import FrameResult

log = logging.getLogger(__name__)
SENTINEL = object()  # put last into the sink inbox: the run is over
JOIN_S = 30.0  # the longest the loop waits for the sink thread to finish
LATENCY_WINDOW = 10_000  # the summary's latency percentiles are of the last this many frames (memory stays flat)


@dataclass
class SourceStats:
    """One source's figures for the final summary."""

    rate: RateMeter = field(default_factory=RateMeter)
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))  # capture -> sinks
    queue_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))  # capture -> released

    def note(self, latency_ms: float, queue_ms: float) -> None:
        """One frame through the sinks: its capture-to-output and queue times."""
        self.rate.tick()
        self.latency_ms.append(latency_ms)
        self.queue_ms.append(queue_ms)

    def summary(self) -> dict[str, float]:
        """Frames, fps while the source gave frames (first to last: one that ended early is not diluted
        by the rest of the run), and latency percentiles: capture to output, of which in the queue."""
        n, span = self.rate.total, self.rate.last - self.rate.started
        lat, queued = self.latency_ms, self.queue_ms
        return {"frames": n, "fps": (n - 1) / span if n > 1 and span > 0 else 0.0,
                "p50_ms": float(np.percentile(lat, 50)) if lat else 0.0,
                "p95_ms": float(np.percentile(lat, 95)) if lat else 0.0,
                "queue_p95_ms": float(np.percentile(queued, 95)) if queued else 0.0,
                "pipeline_p95_ms": float(np.percentile(np.subtract(lat, queued), 95)) if lat else 0.0}


@dataclass
class RunStats:
    rate: RateMeter = field(default_factory=RateMeter)  # frames through the sinks, all sources
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))  # capture -> sinks
    queue_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))  # capture -> released
    per_source: dict[str, SourceStats] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # source id -> why it failed for good
    steps: int = 0
    batched_frames: int = 0  # frames in all engine steps (their mean size: batched_frames / steps)
    error: BaseException | None = None

    @property
    def frames(self) -> int:
        return self.rate.total

    @property
    def fps(self) -> float:
        return self.rate.overall


@dataclass(frozen=True)
class SourceEvent:
    """A health change of a source, on its way to the sinks in frame order."""

    record: dict[str, Any]


@dataclass(frozen=True)
class StepDone:
    """The frames of one engine step have gone to the sinks: the world step (motion capture) fuses them."""

    results: list[FrameResult]


@dataclass(frozen=True)
class SourceClosed:
    """A source removed while running: its own sinks are finished after its last frame."""

    source_id: str


class SinkWorker(threading.Thread):
    """Annotates finished frames and hands them to every sink, off the device loop."""

    def __init__(self, sinks: list[Sink], annotator: Annotator | None, stop: threading.Event,
                 stats: RunStats, on_result: Callable[[FrameResult], None] | None,
                 wants_image: Callable[[FrameResult], bool] | None = None,
                 world: Callable[[list[FrameResult]], Any] | None = None) -> None:
        super().__init__(name="sinks", daemon=True)
        self.inbox: queue.Queue = queue.Queue(maxsize=4)
        self.sinks, self.annotator, self.stop, self.stats, self.on_result = sinks, annotator, stop, stats, on_result
        self.wants_image = wants_image or (lambda result: True)
        self.world = world  # a step's results -> its WorldFrame (or None), handed to sinks' write_world

    def run(self) -> None:
        try:
            while True:
                try:
                    item = self.inbox.get(timeout=0.2)
                except queue.Empty:
                    if self.stop.is_set():
                        return  # stopped and drained
                    continue
                if item is SENTINEL:
                    return
                if isinstance(item, SourceEvent):
                    self._call("event", item.record)
                elif isinstance(item, SourceClosed):
                    self._call("close_source", item.source_id)
                elif isinstance(item, StepDone):
                    world = self.world(item.results) if self.world is not None else None
                    if world is not None:
                        self._call("write_world", world)
                else:
                    self._handle(item)
        except BaseException as exc:  # reported by the main loop as the run's one error
            self.stats.error = self.stats.error or exc
            self.stop.set()

    def _call(self, method: str, arg: Any) -> None:
        for sink in self.sinks:
            handler = getattr(sink, method, None)
            if handler is not None:
                handler(arg)

    def _handle(self, result: FrameResult) -> None:
        frame = result.frame
        queued = max(0.0, (frame.released_ns - frame.capture_ns) / 1e6) if frame.released_ns else 0.0
        result.latency_ms = {"queue": queued, **result.latency_ms}  # named first: it comes first
        t0 = time.perf_counter()
        if self.annotator is not None and self.wants_image(result):
            result.annotated = self.annotator.annotate(result.frame.image.copy(), result)
        result.latency_ms["annotate"] = (time.perf_counter() - t0) * 1000.0
        for sink in self.sinks:
            sink.write(result)
        latency = (time.time_ns() - frame.capture_ns) / 1e6
        self.stats.rate.tick()
        self.stats.latency_ms.append(latency)
        self.stats.queue_ms.append(queued)
        self.stats.per_source.setdefault(frame.source_id, SourceStats()).note(latency, queued)
        if self.on_result is not None:
            self.on_result(result)

    def put(self, item: object) -> bool:
        """Blocking put that gives up when the worker is gone (never blocks forever)."""
        while self.is_alive():
            try:
                self.inbox.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False
