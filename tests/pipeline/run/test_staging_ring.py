"""The engine's uploads go through reused page-locked buffers (pipeline.run.streams.StagingRing), and a
buffer is never written again before the copy out of it has completed. No GPU here: the copy is a
stand-in that reads its buffer only when its event completes, as a DMA engine would."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.run.streams import PIPELINE_DEPTH, StagingRing, Streams
from stages.sapiens2.preprocess import to_device_image, upload


class LateCopy:
    """A copy to the "device" that reads its buffer when it completes (query says whether it has)."""

    def __init__(self, buffer: torch.Tensor, out: torch.Tensor, log: list) -> None:
        self.buffer, self.out, self.done, self.log = buffer, out, False, log

    def complete(self) -> None:
        if not self.done:
            self.out.copy_(self.buffer)
            self.done = True

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append("wait")
        self.complete()


class Device:
    """Copies queued and completed when the test says so."""

    def __init__(self) -> None:
        self.copies: list[LateCopy] = []
        self.log: list[str] = []
        self.allocated = 0

    def send(self, buffer: torch.Tensor):
        out = torch.full_like(buffer, 255)
        copy = LateCopy(buffer, out, self.log)
        self.copies.append(copy)
        return out, copy

    def pin(self, shape, dtype) -> torch.Tensor:
        self.allocated += 1
        return torch.empty(shape, dtype=dtype)

    def finish(self) -> None:
        for copy in self.copies:
            copy.complete()


def _frames(n: int) -> list[np.ndarray]:
    return [np.full((4, 6, 3), i, np.uint8) for i in range(n)]


def test_a_buffer_is_not_rewritten_before_its_copy_completes() -> None:
    device = Device()
    ring = StagingRing(device.send, depth=3, cap=5, pin=device.pin)
    frames = _frames(8)
    outs = [ring.upload(f) for f in frames[:5]]  # no copy has completed: 5 buffers, none reused
    assert device.allocated == 5 and device.log == []
    outs.append(ring.upload(frames[5]))  # at the cap: the host waits for the oldest copy, then reuses it
    assert device.log == ["wait"] and device.allocated == 5
    device.copies[1].complete()  # the device caught up with one more copy: its buffer is free again
    outs.append(ring.upload(frames[6]))
    assert device.log == ["wait"] and device.allocated == 5
    device.finish()
    outs.append(ring.upload(frames[7]))
    device.finish()
    for frame, out in zip(frames, outs):
        np.testing.assert_array_equal(out.numpy(), frame)  # each copy read its own frame


def test_the_steady_state_reuses_depth_buffers() -> None:
    device = Device()
    ring = StagingRing(device.send, pin=device.pin)
    for frame in _frames(20):
        ring.upload(frame)
        ring.upload(frame[:2])  # another shape: a ring of its own
        device.finish()  # each step's copies done before the next step's
    assert device.allocated == ring.buffers() == 2 * (PIPELINE_DEPTH + 1) and device.log == []


def test_uploads_to_cuda_take_the_staging_they_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    staged = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pytest.fail("a pinned buffer of its own"))
    cuda = torch.device("cuda")
    image = to_device_image(np.zeros((4, 6, 3), np.uint8), cuda, True, lambda t: staged.append(t.shape) or t)
    boxes = upload(np.zeros((2, 4), np.float32), cuda, True, lambda t: staged.append(t.shape) or t)
    assert staged == [(4, 6, 3), (2, 4)] and image.shape == (3, 4, 6) and boxes.shape == (2, 4)


def test_the_engine_lanes_stage_uploads_through_a_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.run.streams

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(pipeline.run.streams, "_STREAMS", {})  # no stand-in streams left for later tests
    streams = Streams(torch.device("cuda"), overlap=True, pinned=True)
    assert isinstance(streams.staging, StagingRing) and streams.staging.depth == PIPELINE_DEPTH + 1
    assert Streams(torch.device("cuda"), overlap=True, pinned=False).staging is None  # pageable: the host waits
    assert Streams(torch.device("cpu"), overlap=True, pinned=True).staging is None  # a CPU upload is a view
