"""What a person sees in the terminal: the progress bars of the commands (a run over files, ``batch`` over
videos: tqdm on stderr) and a run's ``Display`` (bar or status line, log lines above it)."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from pipeline.sources import Source
from stages.types import FrameResult

log = logging.getLogger("sapiens2_stream")


def progress_bar(total: int | None, unit: str) -> Any:
    """A tqdm bar on stderr that follows the terminal's width. A terminal that reports no size (a
    pty nobody sized, as some CI runners and ``script`` give) would get a bar of width 0, and tqdm
    then draws nothing at all: 80 columns and 20 rows then."""
    from tqdm import tqdm

    try:
        sized = min(os.get_terminal_size(sys.stderr.fileno())) > 0
    except OSError:
        sized = False
    if sized:
        return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)
    return tqdm(total=total, unit=unit, file=sys.stderr, ncols=80, nrows=20)


class Display:
    """Progress bar with fps when every source is a file; one rewritten status line otherwise. While
    it shows, log lines are printed above it instead of onto it. Where stderr is not a terminal (a log
    file, a pipe) neither is drawn: a plain log line says the same every PLAIN_EVERY_S instead."""

    PLAIN_EVERY_S = 30.0

    def __init__(self, sources: list[Source], enabled: bool, total: int | None, terminal: bool = True) -> None:
        self.sources, self.enabled, self.total, self.terminal = sources, enabled, total, terminal
        self.done = 0  # frames through the sinks
        self.live = any(s.info.live for s in sources)
        self.bar = None
        self.last = 0.0
        self._handler: logging.Handler | None = None
        self._status_shown = False
        self._persons: dict[str, int] = {}
        if enabled and terminal and not self.live:
            self.bar = progress_bar(total, "frame")
        if enabled and terminal:
            self._handler = _AboveDisplay(self)
            root = logging.getLogger()
            for handler in root.handlers:
                if getattr(handler, "stream", None) is sys.stderr:
                    self._handler.setFormatter(handler.formatter)
                    handler.addFilter(_mute)
            root.addHandler(self._handler)

    def on_result(self, result: FrameResult) -> None:
        if not self.enabled:
            return
        self._persons[result.frame.source_id] = len(result.detections)
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            return
        now = time.monotonic()
        if now - self.last >= (0.5 if self.terminal else self.PLAIN_EVERY_S):
            self.last = now
            self._status(result)

    def _status(self, result: FrameResult | None) -> None:
        lat = "" if result is None else " " + " ".join(f"{k} {v:.0f}ms" for k, v in result.latency_ms.items())
        if len(self.sources) == 1:
            src = self.sources[0]
            text = (f"[{src.health}] frame {src.frames_decoded} drops {src.frames_dropped} reopens {src.reopens} "
                    f"persons {self._persons.get(src.source_id, 0)}{lat}")
        else:
            text = " | ".join(f"{s.source_id} {s.health} {s.frames_decoded}f {s.frames_dropped}d" for s in self.sources)
        if not self.terminal:  # a line of the log: no carriage return, no terminal codes
            if not self.live:
                of = f"/{self.total}" if self.total else ""
                text = f"{self.done}{of} frames done" + (f" (last:{lat})" if lat else "")
            log.info("progress: %s", text)
            return
        sys.stderr.write(f"\r{text}\033[K")
        sys.stderr.flush()
        self._status_shown = True

    def write_line(self, text: str) -> None:
        """A log line above the bar or status line."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
            return
        prefix = "\r\033[K" if self._status_shown else ""
        sys.stderr.write(prefix + text + "\n")
        sys.stderr.flush()
        self._status_shown = False

    def on_idle(self, source: Source) -> None:
        every = 1.0 if self.terminal else self.PLAIN_EVERY_S
        if self.enabled and self.live and time.monotonic() - self.last >= every:
            self.last = time.monotonic()
            self._status(None)

    def close(self) -> None:
        if self._handler is not None:
            root = logging.getLogger()
            root.removeHandler(self._handler)
            for handler in root.handlers:
                handler.removeFilter(_mute)
            self._handler = None
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.terminal and self.live and self._status_shown:
            sys.stderr.write("\n")


class _AboveDisplay(logging.Handler):
    def __init__(self, display: Display) -> None:
        super().__init__()
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.display.write_line(self.format(record))
        except Exception:  # a logging handler must never raise into the pipeline
            self.handleError(record)


def _mute(record: logging.LogRecord) -> bool:
    """Filter for the plain stderr handler while the display prints the records itself."""
    return False
