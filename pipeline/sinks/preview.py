"""``--show``: a preview window sink (OpenCV). Pressing q or Esc asks the run to stop."""

from __future__ import annotations

import threading

import cv2

from stages.types import FrameResult, StreamInfo


class PreviewWindow:
    def __init__(self, stop: threading.Event, title: str = "sapiens2-stream") -> None:
        self.stop, self.title = stop, title

    def open(self, info: StreamInfo) -> None:
        self.title = f"sapiens2-stream: {info.source_id}"

    def write(self, result: FrameResult) -> None:
        image = result.annotated if result.annotated is not None else result.frame.image
        cv2.imshow(self.title, cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        if cv2.waitKey(1) & 0xFF in (ord("q"), 27):
            self.stop.set()

    def close(self) -> None:
        cv2.destroyAllWindows()
