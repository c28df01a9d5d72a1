"""The sink interface: where finished frames go (recorder, JSONL, ZeroMQ, preview).

A sink is opened once with the stream's facts, receives every finished FrameResult in
order from one thread, and is always closed (in a ``finally``), even after an error,
so that recordings and files are finalised.
"""

from __future__ import annotations

from typing import Protocol

from stages.types import FrameResult, StreamInfo


class Sink(Protocol):
    def open(self, info: StreamInfo) -> None: ...

    def write(self, result: FrameResult) -> None: ...

    def close(self) -> None: ...
