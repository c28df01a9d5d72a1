"""The main loop: sources -> engine (device work, one step in flight) -> sink thread (annotate, write).

A step takes at most one frame of each source (the newest of a live source, the next of a file),
collected until every source has given one or ``batch_timeout_s`` passed since the first arrived, so a
slow or reconnecting source never holds the others back (its slot is just empty) and none starves.

Threads: each source's decode thread, this loop and one sink thread, joined by bounded queues and a
stop event. A source that ends is retired; one that fails for good is reported in one line and the
others go on (``stats.failed``); any other failure stops everything with one error. Sinks are always
closed, so recordings and keypoint files are finalised; a sink that fails to finalise makes that the
run's error. Source events reach the sinks through the frames' queue, between the right frames.
Sources can be added and removed while running (``add_source`` / ``remove_source``: thread-safe,
applied between steps).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from pipeline.run.engine import FrameEngine
from pipeline.run.sinkthread import (
    JOIN_S,
    SENTINEL,
    RunStats,
    SinkWorker,
    SourceClosed,
    SourceEvent,
    SourceStats,
    StepDone,
)
from pipeline.sinks import PerSource, Sink
from pipeline.sources import Source, SourceEnded, SourceError
from stages.annotate import Annotator
from stages.types import FrameResult, StreamInfo

log = logging.getLogger(__name__)
_POLL_S = 0.002  # how often the collector looks at the sources while it waits


class Runner:
    """Runs one or more sources through the engine into the sinks (see the module docstring).

    max_frames: per source. pipelined: submit step t+1 before finishing step t (default: only for
    an asynchronous, CUDA, engine). wants_image(result): whether the annotated picture of a frame
    is used by some sink (not drawn otherwise).
    """

    def __init__(self, source: Source | Sequence[Source], engine: FrameEngine, sinks: list[Sink],
                 annotator: Annotator | None, random_weights: bool, max_frames: int | None = None,
                 on_result: Callable[[FrameResult], None] | None = None,
                 on_idle: Callable[[Source], None] | None = None, stop: threading.Event | None = None,
                 info: StreamInfo | None = None, pipelined: bool | None = None,
                 wants_image: Callable[[FrameResult], bool] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 batch_timeout_s: float = 0.01,
                 world: Callable[[list[FrameResult]], Any] | None = None) -> None:
        sources = list(source) if isinstance(source, list | tuple) else [source]
        self.sources: dict[str, Source] = {self._id(s): s for s in sources}
        self.engine, self.sinks, self.annotator = engine, sinks, annotator
        self.random_weights, self.max_frames = random_weights, max_frames
        self.on_result, self.on_idle, self.on_event = on_result, on_idle, on_event
        self.stop = stop or threading.Event()
        self.infos = {self._id(s): (info if info is not None and len(sources) == 1 else s.info) for s in sources}
        # Pipelined: queue step t+1 before collecting step t, so the GPU never waits for the host.
        # Only an asynchronous (CUDA) engine gains from it: on the CPU submit() computes the whole
        # step, and holding its results back would only add one step of latency. None: decide so.
        self.pipelined = bool(getattr(engine, "cuda", False)) if pipelined is None else pipelined
        self.wants_image = wants_image
        self.batch_timeout_s = batch_timeout_s
        self.world = world  # the motion-capture step over each step's results (pipeline.mocap.world)
        self.stats = RunStats()
        self._submitted: dict[str, int] = {sid: 0 for sid in self.sources}
        self._changes: queue.Queue = queue.Queue()  # (kind, payload, reply event, reply box) from other threads
        self._single = len(sources) == 1  # a single-source run: that source failing is the run's error
        self.keep_alive = False  # True: run on with no source left (sources come through add_source)
        self.idle_note: str | None = None  # logged once when every source has ended and the run stays up
        self._gone: dict[str, Source] = {}  # sources that ended, failed or were removed
        self._unfinished: dict[str, int] = {}  # frames submitted to the engine, not yet handed to the sinks
        self._closing: list[str] = []  # retired sources whose outputs are finished once their frames are out

    @staticmethod
    def _id(source: Source) -> str:
        return source.info.source_id if getattr(source, "info", None) is not None else source.source_id

    # -- running ----------------------------------------------------------------------------
    def run(self) -> RunStats:
        """Process until every source ended, stop() or an error; always closes everything."""
        worker = SinkWorker(self.sinks, self.annotator, self.stop, self.stats, self.on_result, self.wants_image,
                            self.world)
        opened: list[Sink] = []
        try:
            for sink in self.sinks:
                for info in self.infos.values():
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
                worker.put(SENTINEL)
                worker.join(JOIN_S)
                if worker.is_alive():
                    log.error("sinks did not finish within %.0f s; closing them anyway", JOIN_S)
            for source in self.sources.values():
                source.stop()
            self._answer_pending_changes()
            for sink in opened:
                try:
                    sink.close()
                except Exception as exc:  # keep closing the others; report the first problem
                    log.debug("closing %s failed", type(sink).__name__, exc_info=True)
                    self.stats.error = self.stats.error or exc
        return self.stats

    def _loop(self, worker: SinkWorker) -> None:
        in_flight = None
        while not self.stop.is_set():
            self._apply_changes(worker)
            self._forward_events(worker)
            self._close_retired(worker)
            if not self.sources and in_flight is None and self._changes.empty():
                if not self.keep_alive:
                    break  # every source ended (or was removed)
                if self.idle_note:
                    log.info("%s", self.idle_note)
                    self.idle_note = None
                self.stop.wait(0.05)  # a control endpoint may add sources, a viewer shows the end: wait
                continue
            try:
                frames = self._collect(first_wait=0.0 if in_flight is not None else 0.25)
            except SourceError:
                if in_flight is not None and self.stats.error is None:
                    self._finish(in_flight, worker)  # decoded before the source failed: keep it
                raise
            if not frames:
                if in_flight is not None:
                    if not self._finish(in_flight, worker):
                        return
                    in_flight = None
                elif self.on_idle is not None:
                    for source in list(self.sources.values()):
                        self.on_idle(source)
                continue
            pending = self.engine.submit_batch(frames)
            self.stats.steps += 1
            self.stats.batched_frames += len(frames)
            for frame in frames:
                self._unfinished[frame.source_id] = self._unfinished.get(frame.source_id, 0) + 1
                self._count_submitted(frame.source_id)
            if in_flight is not None and not self._finish(in_flight, worker):
                return
            in_flight = pending
            if not self.pipelined:
                if not self._finish(in_flight, worker):
                    return
                in_flight = None
        if in_flight is not None and self.stats.error is None:
            self._finish(in_flight, worker)  # also on a stop request: the step is already computed

    def _collect(self, first_wait: float) -> list:
        """At most one frame per source: wait up to ``first_wait`` for the first, then until every
        source gave one or ``batch_timeout_s`` passed."""
        batch: dict[str, Any] = {}
        start = time.monotonic()
        first_at: float | None = None
        while self.sources and not self.stop.is_set():
            for sid, source in list(self.sources.items()):
                if sid in batch:
                    continue
                frame = self._read(sid, source)
                if frame is not None:
                    batch[sid] = frame
                    first_at = first_at if first_at is not None else time.monotonic()
            now = time.monotonic()
            if len(batch) >= len(self.sources):
                break
            if first_at is None and now - start >= first_wait:
                break
            if first_at is not None and now - first_at >= self.batch_timeout_s:
                break
            time.sleep(_POLL_S)
        return list(batch.values())

    def _read(self, sid: str, source: Source):
        """The source's next frame, or None; retires a source that ended or failed for good (the
        failure of a run's only source is the run's error)."""
        try:
            frame = source.read(timeout=0.0)
            if frame is not None:
                frame.released_ns = time.time_ns()
            return frame
        except SourceEnded:
            self._retire(sid, None)
        except SourceError as exc:
            self._retire(sid, str(exc))
            if self._single:
                raise
        return None

    def _retire(self, sid: str, why: str | None) -> None:
        source = self.sources.pop(sid, None)
        if source is not None:
            source.stop()
            self._gone[sid] = source
            self._closing.append(sid)
        if why is not None:
            self.stats.failed[sid] = why
            if not self._single:
                log.error("source %s failed: %s; the other sources go on", sid, why)

    def _count_submitted(self, sid: str) -> None:
        self._submitted[sid] = self._submitted.get(sid, 0) + 1
        if self.max_frames is not None and self._submitted[sid] >= self.max_frames and sid in self.sources:
            self._retire(sid, None)

    def _finish(self, pending, worker: SinkWorker) -> bool:
        results = self.engine.finish_batch(pending, self.random_weights)
        for result in results:
            self._unfinished[result.frame.source_id] -= 1
            source = self._source_of(result.frame.source_id)
            if source is not None:
                result.drops = {"source": result.frame.skipped_before, "reopens": source.reopens,
                                "decode_errors": getattr(source, "decode_errors", 0)}
            if not worker.put(result):
                return False
        if self.world is not None and results and not worker.put(StepDone(list(results))):
            return False
        return True

    def _source_of(self, sid: str) -> Source | None:
        return self.sources.get(sid) or self._gone.get(sid)

    def _close_retired(self, worker: SinkWorker) -> None:
        """Finish the outputs of sources that ended, failed or were removed, once their last frame
        has gone to the sinks (a recording is complete as soon as its source is, not at the run's end)."""
        for sid in list(self._closing):
            if not self._unfinished.get(sid):
                self._closing.remove(sid)
                forget = getattr(self.engine, "forget", None)  # optional: engines that keep per-source state
                if forget is not None:
                    forget(sid)
                why = self.stats.failed.get(sid)
                if why is not None:  # the sinks hear why (a status, a JSONL event line, source_up 0 kept)
                    session = getattr(self._gone.get(sid), "reopens", 0)
                    worker.put(SourceEvent({"event": "failed", "source_id": sid, "time_ns": time.time_ns(),
                                            "session": session, "reason": why}))
                worker.put(SourceClosed(sid))

    def _forward_events(self, worker: SinkWorker) -> None:
        for source in list(self.sources.values()):
            for record in getattr(source, "poll_events", list)():
                if self.on_event is not None:
                    self.on_event(record)
                worker.put(SourceEvent(record))

    # -- sources added and removed while running ----------------------------------------------
    def add_source(self, source: Source, timeout_s: float = 30.0) -> None:
        """Add an opened source (from another thread); ValueError if its id is taken."""
        self._change("add", source, timeout_s)

    def remove_source(self, source_id: str, timeout_s: float = 30.0) -> None:
        """Stop a source and finish its outputs (from another thread); KeyError if there is none."""
        self._change("remove", source_id, timeout_s)

    def _change(self, kind: str, payload: Any, timeout_s: float) -> None:
        if self.stop.is_set():
            raise RuntimeError("the pipeline is stopping")
        done, box = threading.Event(), {}
        self._changes.put((kind, payload, done, box))
        if not done.wait(timeout_s):
            raise TimeoutError(f"the pipeline did not {kind} the source within {timeout_s:.0f} s")
        if "error" in box:
            raise box["error"]

    def _apply_changes(self, worker: SinkWorker) -> None:
        while True:
            try:
                kind, payload, done, box = self._changes.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "add":
                    sid = self._id(payload)
                    self.check_new_id(sid)
                    self._gone.pop(sid, None)
                    if self.random_weights:  # as assemble() marks the sources a run starts with
                        payload.mark_random_weights()
                    info = payload.info
                    for sink in self.sinks:
                        sink.open(info)
                    self.infos[sid] = info
                    self.sources[sid] = payload
                    self._submitted[sid] = 0
                else:
                    if payload not in self.sources:
                        raise KeyError(f"no running source named {payload!r}")
                    self._retire(payload, None)  # its outputs are finished after its frames in flight
            except (ValueError, KeyError) as exc:
                box["error"] = exc
            finally:
                done.set()

    def _answer_pending_changes(self) -> None:
        while True:
            try:
                kind, payload, done, box = self._changes.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                payload.stop()
            box["error"] = RuntimeError("the pipeline stopped")
            done.set()

    def every_source(self) -> list[Source]:
        """Every source of the run: running, ended, failed or removed."""
        return [*self.sources.values(), *(s for sid, s in self._gone.items() if sid not in self.sources)]

    def check_new_id(self, sid: str) -> None:
        """ValueError unless a source may join under ``sid``: not while one of that name runs, and
        not again after one ended when each source writes files of its own (they would be overwritten)."""
        if sid in self.sources:
            raise ValueError(f"a source named {sid!r} is running already")
        if sid in self._gone and any(isinstance(sink, PerSource) for sink in self.sinks):
            raise ValueError(f"a source named {sid!r} ran earlier in this run and its output files would be "
                             "overwritten; add it under another name")

    def describe(self) -> list[dict[str, Any]]:
        """The running sources with their health and figures (for the control endpoint)."""
        out = []
        for sid, source in list(self.sources.items()):
            per = self.stats.per_source.get(sid, SourceStats())
            info = self.infos.get(sid)
            out.append({"id": sid, "health": source.health, "live": bool(info and info.live),
                        "width": info.width if info else None, "height": info.height if info else None,
                        "frames": per.rate.total, "dropped": source.frames_dropped, "reopens": source.reopens})
        return out
