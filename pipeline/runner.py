"""The main loop: source -> engine (device work, one step in flight) -> sink thread (annotate, write).

Threads: the source's decode thread, this loop, and one sink thread; they talk through bounded
queues and share a stop event. Any failure stops everything with one error; sinks are always
closed, so recordings and keypoint files are finalised, and a sink that fails to finalise (a full
disk during the flush) makes that the run's error. Source events (stalled, reconnecting, resumed)
travel to the sinks through the same queue as the frames, so they land between the right frames.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sapiens2_client.timing import RateMeter
from stages.annotate import Annotator
from stages.types import FrameResult, StreamInfo

from .engine import FrameEngine
from .sinks import Sink
from .sources import Source, SourceEnded, SourceError

log = logging.getLogger(__name__)
_SENTINEL = object()
_JOIN_S = 30.0


@dataclass
class RunStats:
    rate: RateMeter = field(default_factory=RateMeter)  # frames through the sinks
    latency_ms: list[float] = field(default_factory=list)  # capture -> sinks written
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


class SinkWorker(threading.Thread):
    """Annotates finished frames and hands them to every sink, off the device loop."""

    def __init__(self, sinks: list[Sink], annotator: Annotator | None, stop: threading.Event,
                 stats: RunStats, on_result: Callable[[FrameResult], None] | None,
                 wants_image: Callable[[], bool] | None = None) -> None:
        super().__init__(name="sinks", daemon=True)
        self.inbox: queue.Queue = queue.Queue(maxsize=4)
        self.sinks, self.annotator, self.stop, self.stats, self.on_result = sinks, annotator, stop, stats, on_result
        self.wants_image = wants_image or (lambda: True)

    def run(self) -> None:
        try:
            while True:
                try:
                    item = self.inbox.get(timeout=0.2)
                except queue.Empty:
                    if self.stop.is_set():
                        return  # stopped and drained
                    continue
                if item is _SENTINEL:
                    return
                if isinstance(item, SourceEvent):
                    self._event(item.record)
                else:
                    self._handle(item)
        except BaseException as exc:  # reported by the main loop as the run's one error
            self.stats.error = self.stats.error or exc
            self.stop.set()

    def _event(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            handler = getattr(sink, "event", None)
            if handler is not None:
                handler(record)

    def _handle(self, result: FrameResult) -> None:
        t0 = time.perf_counter()
        if self.annotator is not None and self.wants_image():
            result.annotated = self.annotator.annotate(result.frame.image.copy(), result)
        result.latency_ms["annotate"] = (time.perf_counter() - t0) * 1000.0
        for sink in self.sinks:
            sink.write(result)
        self.stats.rate.tick()
        self.stats.latency_ms.append((time.time_ns() - result.frame.capture_ns) / 1e6)
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


class Runner:
    def __init__(self, source: Source, engine: FrameEngine, sinks: list[Sink], annotator: Annotator | None,
                 random_weights: bool, max_frames: int | None = None,
                 on_result: Callable[[FrameResult], None] | None = None,
                 on_idle: Callable[[Source], None] | None = None, stop: threading.Event | None = None,
                 info: StreamInfo | None = None, pipelined: bool | None = None,
                 wants_image: Callable[[], bool] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.source, self.engine, self.sinks, self.annotator = source, engine, sinks, annotator
        self.random_weights, self.max_frames = random_weights, max_frames
        self.on_result, self.on_idle, self.on_event = on_result, on_idle, on_event
        self.stop = stop or threading.Event()
        self.info = info  # stream facts for the sinks (defaults to the source's)
        # Pipelined: queue frame t+1 before collecting frame t, so the GPU never waits for the host.
        # Only an asynchronous (CUDA) engine gains from it: on the CPU submit() computes the whole
        # frame, and holding its result back would only add one frame of latency. None: decide so.
        self.pipelined = bool(getattr(engine, "cuda", False)) if pipelined is None else pipelined
        self.wants_image = wants_image  # annotate only when some sink will use the picture
        self.stats = RunStats()

    def run(self) -> RunStats:
        """Process until the source ends, max_frames, stop() or an error; always closes everything."""
        worker = SinkWorker(self.sinks, self.annotator, self.stop, self.stats, self.on_result, self.wants_image)
        opened: list[Sink] = []
        try:
            info = self.info or self.source.info
            for sink in self.sinks:
                sink.open(info)
                opened.append(sink)
            worker.start()
            self._loop(worker)
        except BaseException as exc:
            self.stats.error = self.stats.error or exc
        finally:
            self.stop.set()  # the worker drains what is queued, then exits
            if worker.is_alive():
                self._forward_events(worker)
                worker.put(_SENTINEL)
                worker.join(_JOIN_S)
                if worker.is_alive():
                    log.error("sinks did not finish within %.0f s; closing them anyway", _JOIN_S)
            self.source.stop()
            for sink in opened:
                try:
                    sink.close()
                except Exception as exc:  # keep closing the others; report the first problem
                    log.debug("closing %s failed", type(sink).__name__, exc_info=True)
                    self.stats.error = self.stats.error or exc
        return self.stats

    def _forward_events(self, worker: SinkWorker) -> None:
        for record in getattr(self.source, "poll_events", list)():
            if self.on_event is not None:
                self.on_event(record)
            worker.put(SourceEvent(record))

    def _loop(self, worker: SinkWorker) -> None:
        in_flight = None
        submitted = 0
        while not self.stop.is_set():
            self._forward_events(worker)
            try:
                # With a frame in flight, only take a next frame that is already waiting: otherwise
                # finish the in-flight one now instead of holding its results for a whole frame period.
                frame = self.source.read(timeout=0.0 if in_flight is not None else 0.25)
            except SourceEnded:
                break
            except SourceError:
                if in_flight is not None and self.stats.error is None:
                    self._finish(in_flight, worker)  # decoded before the source failed: keep it
                raise
            if frame is None:
                if in_flight is not None:
                    if not self._finish(in_flight, worker):
                        return
                    in_flight = None
                elif self.on_idle is not None:
                    self.on_idle(self.source)
                continue
            pending = self.engine.submit(frame)
            submitted += 1
            if in_flight is not None and not self._finish(in_flight, worker):
                return
            in_flight = pending
            if not self.pipelined:
                if not self._finish(in_flight, worker):
                    return
                in_flight = None
            if self.max_frames is not None and submitted >= self.max_frames:
                break
        if in_flight is not None and self.stats.error is None:
            self._finish(in_flight, worker)  # also on a stop request: the frame is already computed

    def _finish(self, pending, worker: SinkWorker) -> bool:
        result = self.engine.finish(pending, self.random_weights)
        result.drops = {"source": self.source.frames_dropped, "reopens": self.source.reopens,
                        "decode_errors": getattr(self.source, "decode_errors", 0)}
        return worker.put(result)
