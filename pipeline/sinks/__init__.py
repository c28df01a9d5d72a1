"""The sink interface: where finished frames go (recorder, JSONL, ZeroMQ, preview).

A sink is opened once with the stream's facts, receives every finished FrameResult in
order from one thread, and is always closed (in a ``finally``), even after an error,
so that recordings and files are finalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from stages.types import FrameResult


@dataclass(frozen=True)
class StreamInfo:
    """Facts about a stream known when it opens."""

    source_id: str
    width: int
    height: int
    fps: float | None  # nominal frame rate; None when unknown (live sources may not say)
    time_base: Fraction | None
    live: bool
    random_weights: bool = False


class Sink(Protocol):
    def open(self, info: StreamInfo) -> None: ...

    def write(self, result: FrameResult) -> None: ...

    def close(self) -> None: ...
