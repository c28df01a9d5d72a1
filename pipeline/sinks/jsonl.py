"""Write per-frame keypoints as JSON Lines (a Sink); the record and the line writer are the client's
(``sapiens2_client.jsonl``), so files written here and by a subscriber have one format.

The file is created when the first frame arrives (a run that fails to start leaves an existing
file untouched), each line is written whole or not at all, and source events (stalled,
reconnecting, resumed) are written as ``event`` lines between frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapiens2_client.jsonl import JsonlError, LineWriter, keypoint_record

from stages.types import FrameResult, StreamInfo

__all__ = ["JsonlError", "KeypointWriter", "result_to_record"]


def result_to_record(result: FrameResult, random_weights: bool = False) -> dict[str, Any]:
    """The JSON-ready dict for one frame (see ``sapiens2_client.jsonl``)."""
    frame, det, kp = result.frame, result.detections, result.keypoints
    return keypoint_record(frame=frame.index, pts=frame.pts, time_base=frame.time_base, capture_ns=frame.capture_ns,
                           width=frame.width, height=frame.height,
                           random_weights=bool(result.random_weights or random_weights), boxes=det.boxes,
                           box_scores=det.scores, track_ids=det.track_ids,
                           keypoints=None if kp is None else kp.xy, scores=None if kp is None else kp.scores,
                           keypoints3d=result.keypoints3d)


class KeypointWriter:
    """Sink writing one JSON line per frame to ``path``; ``close`` is idempotent."""

    def __init__(self, path: str | Path, tag_source: bool = False) -> None:
        self.path = Path(path)
        self._lines = LineWriter(self.path)
        self._random_weights = False
        self.tag_source = tag_source  # one file for several sources: each line says whose it is

    @property
    def lines_written(self) -> int:
        return self._lines.lines_written

    def open(self, info: StreamInfo) -> None:
        """Check that the file can be created; it is created (or truncated) by the first frame.
        Opened once per source when it serves several."""
        self._random_weights = self._random_weights or info.random_weights
        self._lines.check()

    def write(self, result: FrameResult) -> None:
        """Append one whole line for ``result``."""
        record = result_to_record(result, self._random_weights)
        if self.tag_source:
            record = {"source": result.frame.source_id, **record}
        self._lines.write(record)

    def event(self, record: dict[str, Any]) -> None:
        """Append an event line (``{"event": ..., "time_ns": ...}``) between frames."""
        record = dict(record)
        source = record.pop("source_id", None)
        self._lines.write({"source": source, **record} if self.tag_source else record)

    def close(self) -> None:
        """Close; safe to call repeatedly and after errors."""
        self._lines.close()
