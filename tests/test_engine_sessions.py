"""A reopened source is a new stream: the engine resets tracks and smoothing on its first frame."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.engine import FrameEngine
from pipeline.stages_setup import Stages
from stages.detector import FullFrameDetector
from stages.smoothing import KeypointSmoother
from stages.types import Frame


class CountingDetector(FullFrameDetector):
    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


class CountingSmoother(KeypointSmoother):
    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        super().reset()


def frame(index: int, session: int) -> Frame:
    return Frame(index, np.zeros((8, 8, 3), np.uint8), index, None, index, "cam", session)


def test_first_frame_of_a_new_session_resets_tracks_and_smoothing() -> None:
    detector, smoother = CountingDetector(), CountingSmoother()
    engine = FrameEngine(Stages(torch.device("cpu"), detector), smoother=smoother)
    sessions = [0, 0, 1, 1, 1, 3]
    pending = []
    for i, session in enumerate(sessions):
        pending.append(engine.submit(frame(i, session)))
        if i == 2:  # the pipelined order: frame 2 (new session) submitted before frame 1 finished
            assert (detector.resets, smoother.resets) == (1, 0)
    for p in pending:
        engine.finish(p, random_weights=False)
    assert (detector.resets, smoother.resets) == (2, 2)  # sessions 1 and 3, once each
