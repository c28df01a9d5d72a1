"""Device work of one step: upload once, overlapped stages on CUDA streams, results via pinned buffers.

A step is one frame of each of one or more sources. ``submit_batch`` queues its work (the dense stages:
one forward over all frames; the detector: one batch; pose, then 3D keypoints: one forward over all
persons) and returns a ``Pending``; ``finish_batch`` waits on that step's own events (never a
device-wide synchronize) and returns one FrameResult per frame, so step t may be submitted before step
t-1 is finished. On the CPU the same code runs in order (its CUDA streams: pipeline.run.streams).

Per source the engine keeps a session (a reopened source resets its tracks, carried boxes and
smoothing), a tracker, the boxes carried to the frames that ``detect_every > 1`` skips, and the last
pointmap for the frames that ``pointmap_every > 1`` skips. Every output is checked for finite values on
the device and nothing non-finite is passed on (a float16 stage falls back to bfloat16, said once;
otherwise NonFiniteOutputError stops the run: pipeline.run.fallback).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from pipeline.run.build import Stages
from pipeline.run.fallback import PrecisionFallback
from pipeline.run.step import Carry, Clock, FrameInFlight, Pending, SourceState
from pipeline.run.streams import Streams, all_finite
from stages.detect.tracking import ByteTracker, carry_boxes
from stages.keypoints3d import Lift, lift, smooth3d
from stages.sapiens2.graphs import warming_up
from stages.sapiens2.preprocess import to_device_image, upload
from stages.smoothing import KeypointSmoother
from stages.tasks import TASKS, lift_task, person_task
from stages.types import Detections, Frame, FrameResult, Keypoints, Keypoints3D

log = logging.getLogger(__name__)

def _takes_device_frames(detector, frame: Tensor) -> bool:
    """Whether the detector gets the uploaded frames (``detect_tensors``): it takes them and works on
    the device they are on. One on another device (PersonDetector() takes the current CUDA device,
    beside stages on another) gets the host frames: it refuses the others. A tensor's device is
    always indexed, so this never compares ``cuda`` with ``cuda:0``."""
    return hasattr(detector, "detect_tensors") and getattr(detector, "device", frame.device) == frame.device


class FrameEngine(PrecisionFallback):
    """Runs the configured stages on steps of frames, overlapping the stages on CUDA streams."""

    def __init__(self, stages: Stages, kpt_threshold: float = 0.3, detect_every: int = 1,
                 smoother: KeypointSmoother | None = None, overlap: bool = True, pinned: bool = True,
                 track: bool = False, keypoints3d: Lift | None = None, pointmap_every: int = 1,
                 beta3d: float | None = None) -> None:
        self.stages = stages
        self.pinned = pinned  # page-locked staging for uploads and downloads (off: pageable, host waits)
        self.device = stages.device
        self.cuda = self.device.type == "cuda"
        self.kpt_threshold = kpt_threshold
        self.detect_every = detect_every
        self.track = track
        self._smoother_template = smoother  # copied per source (its parameters, not its state)
        self.beta3d = beta3d  # the 3D smoother's speed coefficient (per unit/s of the map; 2D's is per pixel/s)
        self.person = person_task(stages.estimators)  # the task run on the person crops: its keypoints
        self.every = next((t for t in stages.estimators if TASKS[t].every), None)  # runs every pointmap_every-th frame
        points = next((t for t in stages.estimators if TASKS[t].lift == "points"), None)  # what the 3D step samples
        if keypoints3d is not None and (self.person is None or points is None):
            people = ", ".join(t for t, spec in TASKS.items() if spec.per_person)
            raise ValueError(f"keypoints3d needs a stage run on the person crops ({people}) and one whose map is "
                             f"the points ({lift_task('points')})")
        self.keypoints3d = keypoints3d
        # metric 3D when the pointmap model divides by its predicted scale; canonical camera space otherwise
        self.metric3d = keypoints3d is not None and bool(stages.estimators[points].model.cfg.head.has_scale)
        self.pointmap_every = max(1, pointmap_every)
        self.sources: dict[str, SourceState] = {}
        self.on_precision_change: Callable[[], None] | None = None  # after a float16 -> bfloat16 fallback
        self._warmed: tuple[int, int] | None = None  # (max persons, max frames) of warm_up, once it ran
        graphs = [t for t, est in stages.estimators.items() if est.fastpath.graphs]
        if self.cuda and graphs:
            # Each estimator captures its graphs on its own lane, in its own memory pool
            # (stages.sapiens2.graphs): replays on different streams share no memory.
            log.info("CUDA graphs (%s): each stage's captured and replayed on its own stream, in its own memory "
                     "pool; the stages %s", ", ".join(graphs),
                     "overlap, the detector beside them" if overlap else "run in order on one stream (overlap off)")
        self.streams = Streams(self.device, overlap, pinned)  # overlap off: one stream (a baseline)
        staging = self.streams.staging
        self._staging = None if staging is None else staging.upload  # reused page-locked buffers (CUDA)

    # -- set-up ---------------------------------------------------------------------------
    def warm_up(self, max_persons: int = 8, max_frames: int = 1,
                frame_sizes: tuple[tuple[int, int], ...] = ()) -> dict[str, float]:
        """Run every input shape once, each stage on the stream that will run it: compiled graphs
        and CUDA graphs are recorded where they replay. A detector that takes device frames runs once
        per frame size (H, W) of ``frame_sizes`` on its lane (Ultralytics sets its predictor up on a
        first call, cuDNN picks its kernels per shape). Returns seconds per task."""
        seconds = {}
        self._warmed = (max_persons, max_frames)  # a stage that changes dtype later is warmed up again
        detector = self.stages.detector
        if frame_sizes and hasattr(detector, "detect_tensors"):
            t0 = time.perf_counter()
            with self.streams.use("detect"):
                for h, w in sorted(set(frame_sizes)):
                    image = np.zeros((h, w, 3), np.uint8)
                    frame = to_device_image(image, self.device, False)
                    if _takes_device_frames(detector, frame):
                        detector.detect_tensors([frame])
                    else:
                        detector.detect_batch([image])
            seconds["detect"] = time.perf_counter() - t0
        with warming_up():  # the stages' background compiles start once every stage captured its graphs
            for task in self.stages.estimators:
                seconds[task] = self._warm(task)
        return seconds

    def _warm(self, task: str) -> float:
        max_persons, max_frames = self._warmed
        spec = TASKS[task]
        with self.streams.use(spec.stream):
            return self.stages.estimators[task].warmup(max_persons if spec.per_person else max_frames)

    def forget(self, source_id: str) -> None:
        """Drop a source's tracks, smoothers and cached maps (it ended or was removed)."""
        self.sources.pop(source_id, None)

    def state(self, source_id: str) -> SourceState:
        if source_id not in self.sources:
            tmpl = self._smoother_template
            def copy(beta: float | None) -> KeypointSmoother | None:
                return None if tmpl is None else KeypointSmoother(tmpl.min_cutoff, tmpl.beta if beta is None else beta,
                                                                  tmpl.d_cutoff, tmpl.max_age_s)
            self.sources[source_id] = SourceState(tracker=ByteTracker() if self.track else None, smoother=copy(None),
                                                  smoother3d=copy(self.beta3d) if self.keypoints3d else None)
        return self.sources[source_id]

    @property
    def smoother(self) -> KeypointSmoother | None:
        """The smoother template (per-source copies hold the state)."""
        return self._smoother_template

    # -- the step -------------------------------------------------------------------------
    def submit(self, frame: Frame) -> Pending:
        return self.submit_batch([frame])

    def finish(self, pending: Pending, random_weights: bool) -> FrameResult:
        results = self.finish_batch(pending, random_weights)
        assert len(results) == 1, "finish() is for one-frame steps; use finish_batch()"
        return results[0]

    @torch.inference_mode()
    def submit_batch(self, frames: list[Frame]) -> Pending:
        """Queue all device work of one step (one frame per source) and return without waiting."""
        clock = Clock(self.device)
        with self.streams.use("upload"):
            clock.start("upload", self.streams.get("upload"))
            works = [FrameInFlight(f, to_device_image(f.image, self.device, self.pinned, self._staging),
                               Detections.empty()) for f in frames]
            clock.stop("upload", self.streams.get("upload"))
        uploaded = self.streams.event("upload")
        pending = Pending(works, clock, dtypes={t: e.model.dtype for t, e in self.stages.estimators.items()})
        for work in works:
            state = self.state(work.frame.source_id)
            if work.frame.session != state.submitted_session:
                state.submitted_session = work.frame.session  # a new stream: nothing carries over
                state.carry, state.since_detect = None, 0
                state.pointmap, state.since_pointmap = None, 0
                if state.tracker is not None:
                    state.tracker.reset()
        # Full-frame stages start right after the upload, before the detector has run.
        for task in self.stages.estimators:
            if not TASKS[task].per_person:
                self._dense(pending, task, TASKS[task].stream, uploaded)
        t0 = time.perf_counter()
        with self.streams.use("detect"):
            self._detect(works, uploaded)
        if getattr(self.stages.detector, "kind", None) != "full-frame":  # no detector runs: no time to show
            pending.host_ms["detect"] = (time.perf_counter() - t0) * 1000.0
        if self.person is not None and any(len(w.detections) for w in works):
            self._persons(pending, uploaded)
        return pending

    def _dense(self, pending: Pending, task: str, stream_name: str, uploaded, redo: bool = False) -> None:
        est = self.stages.estimators[task]
        with self.streams.use(stream_name):
            for work in pending.frames:
                self.streams.after(uploaded, stream_name, work.image)
            if task != self.every:
                due = list(pending.frames)
            elif redo:  # the same frames as the first time (the counters have moved on already)
                due = [w for w in pending.frames if w.pointmap_due]
            else:
                due = self._pointmap_due(pending.frames)
            per_frame, checked = [], []
            if due:  # a step that reuses every pointmap reports no pointmap time (the stage did not run)
                clock = pending.clock
                clock.start(task, self.streams.get(stream_name))
                per_frame, checked = est.run_batch([w.image for w in due])
                clock.stop(task, self.streams.get(stream_name))
            if checked:
                self.streams.download(pending, pending.outputs, f"{task}.finite", all_finite(checked), stream_name)
            for work, outputs in zip(due, per_frame):
                before = work.maps.get(task)
                for name, tensor in outputs.items():
                    if name == task and TASKS[task].lift is not None:
                        work.maps[name] = tensor
                    self.streams.download(pending, work.outputs, name, tensor, stream_name)
                state = self.state(work.frame.source_id)
                if task == self.every and (not redo or state.pointmap is before):  # not if a later step's is kept
                    state.pointmap, state.pointmap_host = outputs[task], work.outputs[task]
            if task == self.every and not redo:  # between its frames: the map (and host copy) kept from the last
                for work in pending.frames:
                    if not work.pointmap_due:
                        state = self.state(work.frame.source_id)
                        work.maps[task], work.outputs[task] = state.pointmap, state.pointmap_host
            if self.cuda:
                pending.dense_done.append(self.streams.event(stream_name))

    def _pointmap_due(self, frames: list[FrameInFlight]) -> list[FrameInFlight]:
        """The frames whose source runs its pointmap forward now (every ``pointmap_every``-th frame)."""
        due = []
        for work in frames:
            state = self.state(work.frame.source_id)
            if state.pointmap is None or state.since_pointmap + 1 >= self.pointmap_every \
                    or tuple(state.pointmap.shape[:2]) != (work.frame.height, work.frame.width):
                state.since_pointmap = 0
                work.pointmap_due = True
                due.append(work)
            else:
                state.since_pointmap += 1
        return due

    def _detect(self, works: list[FrameInFlight], uploaded) -> None:
        """Detector for the frames that are due (one batch), carried boxes for the others. A detector
        that takes device frames (``detect_tensors``) gets the uploaded ones: each frame crosses the bus once."""
        due = []
        for work in works:
            state = self.state(work.frame.source_id)
            if state.carry is not None and state.since_detect + 1 < self.detect_every:
                state.since_detect += 1
                carry = state.carry
                work.detections = Detections(np.zeros((len(carry.scores), 4), np.float32), carry.scores,
                                             carry.track_ids)
                work.carried = True
            else:
                state.since_detect, state.carry = 0, None  # the pose of this frame's persons carries, if any
                due.append(work)
        detector, found = self.stages.detector, []
        if due and _takes_device_frames(detector, due[0].image):
            self.streams.after(uploaded, "detect", *(w.image for w in due))
            found = detector.detect_tensors([w.image for w in due])
        elif due:
            found = detector.detect_batch([w.frame.image for w in due])
        for work, detections in zip(due, found):
            tracker = self.state(work.frame.source_id).tracker
            work.detections = detections if tracker is None else tracker.update(detections, work.frame.image)

    def _persons(self, pending: Pending, uploaded, redo: bool = False) -> None:
        """The person task on every person of the step, in one forward; its keypoints in ``<task>.xy`` ...."""
        task = self.person
        estimator, lane = self.stages.estimators[task], TASKS[task].stream
        with self.streams.use(lane):
            self.streams.after(uploaded, lane, *(w.image for w in pending.frames))
            pending.clock.start(task, self.streams.get(lane))
            wh, start = [], 0
            with_persons = [w for w in pending.frames if len(w.detections)]
            for work in pending.frames:
                n = len(work.detections)
                work.persons = slice(start, start + n)
                start += n
                if n and work.boxes is None:  # set already when this step's pose runs again (fp16 fall-back)
                    state = self.state(work.frame.source_id)
                    work.boxes = state.carry.boxes if work.carried else upload(work.detections.boxes, self.device,
                                                                                 self.pinned, self._staging)
                if n:
                    wh.append(upload(np.tile(np.float32([work.frame.width, work.frame.height]), (n, 1)),
                                     self.device, self.pinned, self._staging))
            boxes_t, wh_t = torch.cat([w.boxes for w in with_persons]), torch.cat(wh)  # (P, 4), (P, 2)
            xy, scores, checked = estimator.run_batch([w.image for w in with_persons], [w.boxes for w in with_persons])
            # Checked before the clamp below, which would turn an Inf into the image's edge.
            finite = all_finite(checked)
            # Crops extend 25% beyond the box, so the model may place a keypoint off-image; the
            # stream's consumers get in-frame coordinates (the score says how sure it is).
            xy = torch.minimum(xy.clamp(min=0.0), (wh_t - 1.0)[:, None, :])  # (P, K, 2)
            pending.clock.stop(task, self.streams.get(lane))
            if self.detect_every > 1 and not redo:  # a redo's boxes are older than the carry of the next step
                carried = carry_boxes(xy, scores, self.kpt_threshold, wh_t, boxes_t)  # (P, 4), on the device
                for work in pending.frames:
                    if len(work.detections):
                        state = self.state(work.frame.source_id)
                        state.carry = Carry(carried[work.persons], work.detections.scores,
                                            work.detections.track_ids)
            for name, tensor in (("finite", finite), ("xy", xy), ("scores", scores), ("boxes", boxes_t)):
                self.streams.download(pending, pending.outputs, f"{task}.{name}", tensor, lane)
            if self.keypoints3d is not None:
                self._lift(pending, with_persons, xy, scores)

    def _lift(self, pending: Pending, works: list[FrameInFlight], xy: Tensor, scores: Tensor) -> None:
        """Sample each frame's points map at its persons' keypoints (on the person task's stream, after
        the step's dense stages), one frame at a time (frames may differ in size)."""
        task = self.person
        lane = TASKS[task].stream
        self.streams.after_all(pending.dense_done, lane)
        pending.clock.start("keypoints3d", self.streams.get(lane))
        background = int(self.stages.background_id)
        parts = []
        for work in works:
            rows = work.persons
            self.streams.in_use(lane, *work.maps.values())
            maps = {TASKS[name].lift: m for name, m in work.maps.items()}  # points, classes, alpha
            parts.append(lift(maps["points"], xy[rows], scores[rows], self.keypoints3d, maps.get("classes"),
                              maps.get("alpha"), background))
        xyz, valid, root, root_valid = (torch.cat(t) for t in zip(*parts))
        pending.clock.stop("keypoints3d", self.streams.get(lane))
        for name, tensor in (("xyz", xyz), ("xyz_valid", valid), ("root", root), ("root_valid", root_valid)):
            self.streams.download(pending, pending.outputs, f"{task}.{name}", tensor, lane)

    # -- finishing ------------------------------------------------------------------------
    def finish_batch(self, pending: Pending, random_weights: bool) -> list[FrameResult]:
        """Wait for this step's results, make sure every output is finite, assemble the FrameResults."""
        pending.wait()
        self._ensure_finite(pending)
        latency = {**pending.clock.millis(), **pending.host_ms}
        host = {k: v.numpy() for k, v in pending.outputs.items() if not k.endswith(".finite")}
        results = []
        for work in pending.frames:
            results.append(self._result(work, host, latency, random_weights))
        return results

    def _result(self, work: FrameInFlight, host: dict[str, np.ndarray], latency: dict[str, float],
                random_weights: bool) -> FrameResult:
        frame, det = work.frame, work.detections
        state = self.state(frame.source_id)
        if frame.session != state.finished_session:
            state.finished_session = frame.session
            for smoother in (state.smoother, state.smoother3d):
                if smoother is not None:
                    smoother.reset()
        out = {k: v.numpy() for k, v in work.outputs.items()}
        keypoints = keypoints3d = None
        if self.person is not None:
            num_keypoints = self.stages.estimators[self.person].model.cfg.num_labels
            key = f"{self.person}."
            if len(det) and key + "xy" in host:
                xy, scores = host[key + "xy"][work.persons], host[key + "scores"][work.persons]
                det = Detections(host[key + "boxes"][work.persons], det.scores, det.track_ids)
                if state.smoother is not None:
                    xy = state.smoother(xy, det.track_ids, frame.clock_s)
                keypoints = Keypoints(xy, scores)
                if key + "xyz" in host:
                    keypoints3d = self._keypoints3d(host, work, state, det, frame)
            else:
                keypoints = Keypoints.empty(num_keypoints)
                if self.keypoints3d is not None:
                    keypoints3d = Keypoints3D.empty(num_keypoints, self.metric3d)
        fields, maps = {}, {}  # each full-frame task's result: a FrameResult field, or one of its maps
        for task, est in self.stages.estimators.items():
            spec = TASKS[task]
            if not spec.per_person and task in out:
                if spec.result is None:
                    maps[task] = est.result(out)
                else:
                    fields[spec.result] = est.result(out)
        latency = {k: v for k, v in latency.items() if k != self.every or work.pointmap_due}  # ran for this frame
        return FrameResult(frame=frame, detections=det, keypoints=keypoints, keypoints3d=keypoints3d, maps=maps,
                           latency_ms=latency, random_weights=random_weights, **fields)

    def _keypoints3d(self, host: dict[str, np.ndarray], work: FrameInFlight, state: SourceState, det: Detections,
                     frame: Frame) -> Keypoints3D:
        rows, key = work.persons, f"{self.person}."
        xyz, valid = host[key + "xyz"][rows], host[key + "xyz_valid"][rows].astype(bool)
        root, root_valid = host[key + "root"][rows], host[key + "root_valid"][rows].astype(bool)
        if state.smoother3d is not None:
            xyz, valid, root, root_valid = smooth3d(state.smoother3d, xyz, valid, det.track_ids, frame.clock_s,
                                                    self.keypoints3d.hips)
        return Keypoints3D(xyz, valid, root, root_valid, self.metric3d)


__all__ = ["FrameEngine"]
