"""The device side of a step: one CUDA stream per stage, their events, the pinned staging ring of
uploads and pinned downloads.

On a GPU the stages run each on its own stream (overlapped; CUDA graphs too: each stage captures
its own on its stream) or all on one (serialised: a benchmark baseline). The streams of a device
are made once and shared by its engines: a CUDA graph replays on the stream it was captured on, so
an engine made after another's warm-up (a benchmark's next row) finds the graphs made. On the CPU
there are no streams: the stream contexts are no-ops and a "download" is the tensor itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from stages.tasks import streams

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.run.step import Pending

PIPELINE_DEPTH = 2  # steps in flight: the runner submits step t before it finishes step t-1


def stream_names() -> tuple[str, ...]:
    """The CUDA streams of a device: the upload's, the detector's and the tasks' (stages.tasks)."""
    return ("upload", "detect", *streams())


@dataclass
class _Slot:
    buffer: Tensor  # page-locked host memory
    event: Any = None  # completion of the last copy out of it (None: never used)


def _pinned(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=True)


class StagingRing:
    """Page-locked buffers reused for uploads: per (shape, dtype) a ring of ``depth`` buffers.

    ``upload`` copies the host data into the next buffer (the one host copy every pinned upload
    makes), starts the non-blocking copy to the device on the current stream and records its
    event. A buffer is written again only once that event has completed: a busy one is skipped
    and the ring grows (several frames of one size per step, a device that fell behind), up to
    ``cap`` buffers, beyond which the host waits for the oldest copy. ``send`` (buffer -> device
    tensor, event) is the copy; tests replace it.
    """

    def __init__(self, send: Callable[[Tensor], tuple[Tensor, Any]], depth: int = PIPELINE_DEPTH + 1,
                 cap: int = 16, pin: Callable[[tuple[int, ...], torch.dtype], Tensor] = _pinned) -> None:
        self.send, self.depth, self.cap, self.pin = send, depth, max(cap, depth), pin
        self.rings: dict[tuple, list[_Slot]] = {}
        self.turn: dict[tuple, int] = {}

    def upload(self, data: Any) -> Tensor:
        """Host array or tensor -> the same on the device (returned at once; the copy runs on)."""
        host = torch.as_tensor(data)
        slot = self._take((tuple(host.shape), host.dtype))
        slot.buffer.copy_(host)
        out, slot.event = self.send(slot.buffer)
        return out

    def _take(self, key: tuple) -> _Slot:
        ring = self.rings.setdefault(key, [])
        if len(ring) < self.depth:
            ring.append(_Slot(self.pin(*key)))
            return ring[-1]
        turn = self.turn.get(key, 0) % len(ring)
        self.turn[key] = turn + 1
        slot = ring[turn]
        if slot.event is not None and not slot.event.query():  # its copy has not read it yet
            if len(ring) < self.cap:
                ring.insert(turn, _Slot(self.pin(*key)))  # the busy one comes round again next time
                return ring[turn]
            slot.event.synchronize()
        return slot

    def buffers(self) -> int:
        """How many page-locked buffers the ring holds."""
        return sum(len(ring) for ring in self.rings.values())


_STREAMS: dict[tuple[int | None, bool], dict[str, Any]] = {}


def device_streams(device: torch.device, overlap: bool) -> dict[str, Any]:
    """The stages' streams on a CUDA device, made at the first ask and the same ever after: one per
    stage, or (overlap off) one for all, in order."""
    key = (device.index, overlap)
    if key not in _STREAMS:
        if overlap:
            _STREAMS[key] = {n: torch.cuda.Stream(device) for n in stream_names()}
        else:
            one = torch.cuda.Stream(device)
            _STREAMS[key] = dict.fromkeys(stream_names(), one)
    return dict(_STREAMS[key])


class Streams:
    """The streams of the stages by name, and the few operations the engine does with them."""

    def __init__(self, device: torch.device, overlap: bool, pinned: bool) -> None:
        self.cuda = device.type == "cuda"
        self.pinned = pinned  # page-locked staging for downloads (off: pageable, the host waits)
        self.cuda_streams = device_streams(device, overlap) if self.cuda else {}
        # Uploads through a ring of reused page-locked buffers; pinned off: pageable copies (the host waits).
        self.staging = StagingRing(self._send) if self.cuda and pinned else None
        self.device = device

    def _send(self, buffer: Tensor) -> tuple[Tensor, Any]:
        """The staging ring's copy: non-blocking, on the current stream (the upload lane's)."""
        out = buffer.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return out, event

    def get(self, name: str):
        """The stream of a stage (None on the CPU), e.g. for Clock marks."""
        return self.cuda_streams.get(name)

    def use(self, name: str):
        """Context: the work queued inside runs on that stage's stream."""
        return torch.cuda.stream(self.cuda_streams[name]) if self.cuda else contextlib.nullcontext()

    def download(self, pending: Pending, into: dict, name: str, tensor: Tensor, lane: str) -> None:
        """Copy to a pinned host buffer on the stage's stream and remember the completion event
        (pinned off: a plain blocking copy to pageable memory).

        Not a ring: the buffer is handed to the sinks as the FrameResult's array, without a copy, and
        lives as long as they hold it; PyTorch's caching host allocator takes it back when the last
        view is gone and its copy has completed, and hands it out again (no new page-locked memory
        in the steady state). A ring would have to copy each result out (up to 32 MB per 1080p matte)
        or trust the sinks to let go in time."""
        if self.cuda and not self.pinned:
            into[name] = tensor.cpu()
        elif self.cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            pending.done.append(self.event(lane))
            into[name] = host
        else:
            into[name] = tensor

    def event(self, lane: str):
        """An event recorded now on that stage's stream (None on the CPU)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.cuda_streams[lane])
        return event

    def after(self, event, lane: str, *tensors: Tensor) -> None:
        """Order a stage after an event (the upload); tell the allocator the tensors are in use on
        that stream."""
        if event is not None:
            self.cuda_streams[lane].wait_event(event)
            self.in_use(lane, *tensors)

    def after_all(self, events: list, lane: str) -> None:
        for event in events:
            self.cuda_streams[lane].wait_event(event)

    def in_use(self, lane: str, *tensors: Tensor) -> None:
        """Tensors made on another stream and read on this one are not freed under it."""
        if self.cuda:
            for tensor in tensors:
                tensor.record_stream(self.cuda_streams[lane])


def all_finite(tensors: list[Tensor]) -> Tensor:
    """One device bool: every value of every tensor is finite (no host sync).

    A float64 sum per tensor: one pass that makes no bool tensor the size of the input (raw pose
    heatmaps are 15 M values per person); an Inf or NaN anywhere makes the sum non-finite (Inf - Inf
    is NaN), and finite values of any float dtype cannot overflow it (3.4e38 x 2^53 < 1.8e308).
    """
    return torch.isfinite(torch.stack([t.sum(dtype=torch.float64) for t in tensors])).all()


__all__ = ["PIPELINE_DEPTH", "StagingRing", "Streams", "all_finite", "stream_names"]
