"""``--export-trc``: the world skeletons of a motion-capture run as TRC files when the run ends."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.mocap.export import write_trc
from pipeline.sinks.world import WorldWriter
from stages.mocap.fuse import WorldFrame
from stages.types import FrameResult, StreamInfo

log = logging.getLogger(__name__)


class TrcExport:
    """``--export-trc``: at the end of the run, the world skeletons as TRC. It reads the world JSONL
    (the run's ``--save-world`` file, or one it spools beside the TRC and removes), so it exports
    what the run computed even when the run ends on an error."""

    def __init__(self, path: str | Path, up: str, world_jsonl: str | Path | None = None) -> None:
        self.path, self.up = Path(path), up
        self._own = world_jsonl is None
        self.source = Path(world_jsonl) if world_jsonl else self.path.with_name(self.path.name + ".world.jsonl.part")
        self._spool = WorldWriter(self.source) if self._own else None
        self.steps = 0
        self.written: list[Path] = []  # the TRC files, once closed
        self.camera_rate: float | None = None  # the cameras' nominal fps (the TRC's CameraRate)
        self.opened = False  # a source opened: the run started (one that never did says nothing at close)

    def open(self, info: StreamInfo) -> None:
        self.camera_rate = self.camera_rate or info.fps
        self.opened = True

    def write(self, result: FrameResult) -> None:
        pass

    def write_world(self, world: WorldFrame) -> None:
        if self._spool is not None:
            self._spool.write_world(world)
        self.steps += 1

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
        try:
            if self.steps and self.source.exists():
                export = write_trc(self.source, self.path, self.up, camera_rate=self.camera_rate)
                self.written = export.paths
                for line in export.wrote():
                    log.info("%s", line)
                if export.warning():
                    log.warning("--export-trc %s: %s", self.path, export.warning())
            elif self.opened:
                log.warning("--export-trc %s: no world step was fused: no TRC written", self.path)
        finally:
            if self._own:
                self.source.unlink(missing_ok=True)
