"""What a step carries from submit to finish: stage timing (``Clock``), the step in flight
(``Pending``), what the engine keeps per frame of a step (``FrameInFlight``) and per source between
steps (``SourceState``, ``Carry``). On the CPU the clock reads perf_counter; on CUDA, events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from stages.detect.tracking import ByteTracker
    from stages.smoothing import KeypointSmoother
    from stages.types import Detections, Frame


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
class Carry:
    """Boxes for the frames the detector skips: on the device, aligned with the last detection's
    scores and track ids (host)."""

    boxes: Tensor  # (N, 4) xyxy on the device
    scores: np.ndarray  # (N,)
    track_ids: np.ndarray  # (N,)


@dataclass
class SourceState:
    """What the engine remembers about one source between steps."""

    submitted_session: int = 0
    finished_session: int = 0
    since_detect: int = 0  # frames since the detector last ran
    carry: Carry | None = None
    tracker: ByteTracker | None = None
    smoother: KeypointSmoother | None = None
    smoother3d: KeypointSmoother | None = None
    pointmap: Tensor | None = None  # (H, W, 3) on the device: the last one computed (pointmap_every)
    pointmap_host: Tensor | None = None  # its host copy (the frames that reuse it do not download it again)
    since_pointmap: int = 0


@dataclass
class FrameInFlight:
    """One frame of a step in flight."""

    frame: Frame
    image: Tensor  # (3, H, W) uint8 on the device
    detections: Detections  # scores and ids; boxes are replaced by the ones pose used (carried or detected)
    carried: bool = False
    boxes: Tensor | None = None  # (N, 4) the boxes pose ran on, on the device
    persons: slice = field(default_factory=lambda: slice(0, 0))  # this frame's rows in the step's person batch
    outputs: dict[str, Tensor] = field(default_factory=dict)  # host (pinned) tensors of the dense stages
    maps: dict[str, Tensor] = field(default_factory=dict)  # device maps the 3D step reads (TaskSpec.lift)
    pointmap_due: bool = False  # this step runs the frame's pointmap forward (else: its source's last map)


@dataclass
class Pending:
    """Device work of one step in flight; the engine's finish_batch() turns it into FrameResults."""

    frames: list[Any]  # the engine's FrameInFlight, one per frame of the step
    clock: Clock
    outputs: dict[str, Tensor] = field(default_factory=dict)  # host tensors of the step (pose, finite flags)
    done: list = field(default_factory=list)  # events to wait for (CUDA only)
    host_ms: dict[str, float] = field(default_factory=dict)
    dense_done: list = field(default_factory=list)  # events of the dense stages (the 3D step waits for them)
    dtypes: dict[str, Any] = field(default_factory=dict)  # task -> the dtype its model ran this step in

    def wait(self) -> None:
        for event in self.done:
            event.synchronize()  # this step's work only
        self.done.clear()
