"""``--save-world``: the world steps of a motion-capture run as JSON lines (``docs/MOCAP.md``)."""

from __future__ import annotations

from pathlib import Path

from sapiens2_client.jsonl import LineWriter

from pipeline.mocap.world import world_record
from stages.mocap.fuse import WorldFrame
from stages.types import FrameResult, StreamInfo


class WorldWriter:
    """``--save-world``: a sink of world steps (frames are not its business); created by its first step."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lines = LineWriter(self.path)

    @property
    def lines_written(self) -> int:
        return self._lines.lines_written

    def open(self, info: StreamInfo) -> None:
        pass

    def write(self, result: FrameResult) -> None:
        pass

    def write_world(self, world: WorldFrame) -> None:
        self._lines.write(world_record(world))

    def close(self) -> None:
        self._lines.close()
