"""Per-frame device work: upload once, overlapped stages on CUDA streams, results via pinned buffers.

``FrameEngine.submit(frame)`` queues all device work of one frame and returns a ``Pending``;
``Pending.collect()`` waits on that frame's own events (never a device-wide synchronize) and
returns the host results. The runner submits frame t before collecting frame t-1, so the
detector of t overlaps the Sapiens2 work of t-1. On the CPU the same code runs in order: the
stream contexts are no-ops and the "events" are wall-clock stamps.

Stream layout: U upload -> S segmentation, M matting, N normals/pointmap start as soon as the
frame is on the device; D detector (host loop of Ultralytics) in parallel; P pose waits only for
its own frame's boxes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from stages.detector import boxes_from_keypoints
from stages.sapiens2.estimators import NonFiniteOutputError
from stages.sapiens2.preprocess import to_device_image, upload
from stages.smoothing import KeypointSmoother
from stages.types import Detections, Frame, FrameResult, Keypoints, Matte

from .stages_setup import Stages

log = logging.getLogger(__name__)


class Clock:
    """Stage timing: CUDA events on a GPU (read after collect), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: dict[str, tuple] = {}

    def start(self, name: str, stream=None) -> None:
        self.marks[name] = (self._mark(stream), None)

    def stop(self, name: str, stream=None) -> None:
        self.marks[name] = (self.marks[name][0], self._mark(stream))

    def _mark(self, stream):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def millis(self) -> dict[str, float]:
        out = {}
        for name, (a, b) in self.marks.items():
            if b is None:
                continue
            if self.cuda:
                b.synchronize()  # done already when its stage's results were collected
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1000.0
        return out


@dataclass
class Pending:
    """Device work of one frame in flight; collect() turns it into a FrameResult."""

    frame: Frame
    detections: Detections
    clock: Clock
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # host (pinned) tensors
    done: list = field(default_factory=list)  # events to wait for (CUDA only)
    host_ms: dict[str, float] = field(default_factory=dict)

    def collect(self) -> dict[str, np.ndarray]:
        for event in self.done:
            event.synchronize()  # this frame's work only
        for name, flag in self.outputs.items():
            if name.endswith(".finite") and not bool(flag):
                stage = name.split(".")[0]
                raise NonFiniteOutputError(
                    f"{stage}: the model produced non-finite values (NaN/Inf); try --dtype bfloat16 or float32")
        return {k: v.numpy() for k, v in self.outputs.items() if not k.endswith(".finite")}


class FrameEngine:
    """Runs the configured stages on one frame at a time, overlapping them on CUDA streams."""

    def __init__(self, stages: Stages, kpt_threshold: float = 0.3, detect_every: int = 1,
                 smoother: KeypointSmoother | None = None, overlap: bool = True, pinned: bool = True) -> None:
        self.stages = stages
        self.pinned = pinned  # page-locked staging for uploads and downloads (off: pageable, host waits)
        self.device = stages.device
        self.cuda = self.device.type == "cuda"
        self.kpt_threshold = kpt_threshold
        self.detect_every = detect_every
        self.smoother = smoother
        # Frame.session of the last frame submitted / finished: a reopened source is a new stream,
        # whose first frame resets tracks and carried boxes (at submit) and smoothing (at finish;
        # frames finish in order, possibly after the next one was submitted).
        self._submitted_session = self._finished_session = 0
        names = ("upload", "detect", "seg", "matting", "dense", "pose")
        graphs = [t for t, est in stages.estimators.items()
                  if getattr(getattr(est, "fastpath", None), "cuda_graphs", False)]
        if self.cuda and overlap and graphs:
            # CUDA-graph replays of all compiled models share one memory pool; replays on different
            # streams could overwrite each other's outputs before they are copied out.
            log.info("CUDA graphs (%s): the stages run in order on one stream, not overlapped", ", ".join(graphs))
            overlap = False
        if self.cuda and overlap:
            self.streams = {n: torch.cuda.Stream(self.device) for n in names}
        elif self.cuda:  # serialised baseline for benchmarks: every stage on one stream, in order
            one = torch.cuda.Stream(self.device)
            self.streams = {n: one for n in names}
        else:
            self.streams = {}

    def _stream(self, name: str):
        return torch.cuda.stream(self.streams[name]) if self.cuda else contextlib.nullcontext()

    def _download(self, pending: Pending, name: str, tensor: torch.Tensor, stream_name: str) -> None:
        """Copy to a pinned host buffer on the stage's stream and remember the completion event
        (pinned off: a plain blocking copy to pageable memory)."""
        if self.cuda and not self.pinned:
            pending.outputs[name] = tensor.cpu()
        elif self.cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.streams[stream_name])
            pending.done.append(event)
            pending.outputs[name] = host
        else:
            pending.outputs[name] = tensor

    def _finite(self, pending: Pending, stage: str, tensor: torch.Tensor, stream_name: str) -> None:
        self._download(pending, f"{stage}.finite", torch.isfinite(tensor).all(), stream_name)

    @torch.inference_mode()
    def submit(self, frame: Frame) -> Pending:
        st = self.stages
        if frame.session != self._submitted_session:
            self._submitted_session = frame.session
            st.detector.reset()
        clock = Clock(self.device)
        with self._stream("upload"):
            clock.start("upload", self.streams.get("upload"))
            image = to_device_image(frame.image, self.device, self.pinned)
            clock.stop("upload", self.streams.get("upload"))
        uploaded = self._event("upload")
        pending = Pending(frame, Detections.empty(), clock)
        # Full-frame stages start right after the upload, before the detector has run.
        for task, stream_name in (("seg", "seg"), ("matting", "matting"), ("normal", "dense"), ("pointmap", "dense")):
            est = st.estimators.get(task)
            if est is None:
                continue
            with self._stream(stream_name):
                self._wait(uploaded, stream_name, image)
                clock.start(task, self.streams.get(stream_name))
                outputs, raw = est.run(image)
                clock.stop(task, self.streams.get(stream_name))
                self._finite(pending, task, raw, stream_name)
                for name, tensor in outputs.items():
                    self._download(pending, name, tensor, stream_name)
        # Detector: Ultralytics runs its own host loop; it syncs only with its own stream.
        t0 = time.perf_counter()
        with self._stream("detect"):
            detections = st.detector.detect(frame.image)
        pending.host_ms["detect"] = (time.perf_counter() - t0) * 1000.0
        pending.detections = detections
        pose = st.estimators.get("pose")
        if pose is not None and len(detections):
            with self._stream("pose"):
                self._wait(uploaded, "pose", image)
                clock.start("pose", self.streams.get("pose"))
                boxes = upload(detections.boxes, self.device, self.pinned)
                heatmaps = pose.infer(pose.preprocess(image, boxes), len(detections))
                xy, scores = pose.postprocess(heatmaps, boxes)
                clock.stop("pose", self.streams.get("pose"))
                self._finite(pending, "pose", xy, "pose")
                self._download(pending, "pose.xy", xy, "pose")
                self._download(pending, "pose.scores", scores, "pose")
        return pending

    def _event(self, stream_name: str):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.streams[stream_name])
        return event

    def _wait(self, event, stream_name: str, tensor: torch.Tensor) -> None:
        """Order a stage after the upload; tell the allocator the frame is in use on that stream."""
        if event is not None:
            self.streams[stream_name].wait_event(event)
            tensor.record_stream(self.streams[stream_name])

    def finish(self, pending: Pending, random_weights: bool) -> FrameResult:
        """Wait for this frame's results and assemble the FrameResult."""
        host = pending.collect()
        frame, det = pending.frame, pending.detections
        if frame.session != self._finished_session:
            self._finished_session = frame.session
            if self.smoother is not None:
                self.smoother.reset()
        keypoints = None
        if "pose" in self.stages.estimators:
            if "pose.xy" in host:
                xy, scores = host["pose.xy"], host["pose.scores"]
                # Crops extend 25% beyond the box, so the model may place a keypoint off-image; the
                # stream's consumers get in-frame coordinates (the score says how sure it is).
                xy = np.clip(xy, 0.0, [frame.width - 1, frame.height - 1]).astype(np.float32)
                if self.smoother is not None:
                    xy = self.smoother(xy, det.track_ids, frame.capture_ns / 1e9)
                keypoints = Keypoints(xy, scores)
                if self.detect_every > 1:
                    self.stages.detector.carry(
                        boxes_from_keypoints(xy, scores, self.kpt_threshold, (frame.height, frame.width)))
            else:
                keypoints = Keypoints.empty(self.stages.estimators["pose"].model.cfg.num_labels)
        matte = Matte(host["matting"], host["matting.fg"]) if "matting" in host else None
        latency = {**pending.clock.millis(), **pending.host_ms}
        return FrameResult(frame=frame, detections=det, keypoints=keypoints, seg=host.get("seg"), matte=matte,
                           normals=host.get("normal"), pointmap=host.get("pointmap"), latency_ms=latency,
                           random_weights=random_weights)


__all__ = ["FrameEngine", "Pending", "Stages"]
