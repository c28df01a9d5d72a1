"""What an archive run (``sapiens2-stream batch``) tells while it runs and at its end: a bar (or a line)
per finished video, and the summary table of every input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


class Progress:
    """A bar over the videos on a terminal; one line per finished video otherwise."""

    def __init__(self, total: int, bar: bool) -> None:
        self.total, self.done = total, 0
        self.bar = None
        if bar:
            from pipeline.cli.terminal import progress_bar

            self.bar = progress_bar(total, "video")

    def update(self, row: dict[str, Any]) -> None:
        self.done += 1
        text = f"[{self.done}/{self.total}] {row['video_id']}: {row['status']}, {row['frames']} frames in " \
               f"{row['seconds']:.1f} s" + (f" ({_note(row)})" if _note(row) else "")
        if self.bar is None:
            print(text, file=sys.stderr, flush=True)
            return
        self.bar.update(1)
        if row["status"] != "done":
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _note(row: dict[str, Any]) -> str:
    """The error, or for a video done with packets it could not decode, how many."""
    skipped = row.get("decode_errors") or 0
    return row["error"] or (f"{skipped} corrupt packets skipped" if skipped else "")


def print_summary(report: list[dict[str, Any]], path: Path) -> None:
    """Every input, then the counts, on stdout."""
    width = max(len("video_id"), *(len(row["video_id"]) for row in report))
    print(f"{'video_id':<{width}}  {'status':<10}  {'frames':>6}  {'seconds':>7}  error")
    for row in report:
        print(f"{row['video_id']:<{width}}  {row['status']:<10}  {row['frames']:>6}  {row['seconds']:>7.1f}  "
              f"{_note(row)}")
    counts = {status: sum(row["status"] == status for row in report) for status in ("done", "skipped", "failed",
                                                                                    "unfinished")}
    print(f"{len(report)} inputs: {counts['done']} done, {counts['skipped']} skipped (complete before), "
          f"{counts['failed']} failed, {counts['unfinished']} unfinished; summary in {path}", flush=True)
