"""A reopened source is a new stream: the engine resets its tracks and smoothing on its first frame."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.run.build import Stages
from pipeline.run.engine import FrameEngine
from stages.detect import FullFrameDetector
from stages.detect.tracking import ByteTracker
from stages.smoothing import KeypointSmoother
from stages.types import Frame


class CountingTracker(ByteTracker):
    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        super().reset()


class CountingSmoother(KeypointSmoother):
    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        super().reset()


def frame(index: int, session: int, source: str = "cam") -> Frame:
    return Frame(index, np.zeros((8, 8, 3), np.uint8), index, None, index, source, session)


def test_first_frame_of_a_new_session_resets_tracks_and_smoothing() -> None:
    engine = FrameEngine(Stages(torch.device("cpu"), FullFrameDetector()), smoother=KeypointSmoother(), track=True)
    tracker, smoother = CountingTracker(), CountingSmoother()
    state = engine.state("cam")
    state.tracker, state.smoother = tracker, smoother
    other = engine.state("other")
    other.tracker, other.smoother = CountingTracker(), CountingSmoother()
    sessions = [0, 0, 1, 1, 1, 3]
    pending = []
    for i, session in enumerate(sessions):
        pending.append(engine.submit_batch([frame(i, session), frame(i, 0, "other")]))
        if i == 2:  # the pipelined order: frame 2 (new session) submitted before frame 1 finished
            assert (tracker.resets, smoother.resets) == (1, 0)
    for p in pending:
        engine.finish_batch(p, random_weights=False)
    assert (tracker.resets, smoother.resets) == (2, 2)  # sessions 1 and 3, once each
    assert (other.tracker.resets, other.smoother.resets) == (0, 0)  # another source keeps its state
