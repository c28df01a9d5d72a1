"""Built-in readers that need no media: the ``demo`` clip and a synthetic live camera.

The demo clip is synthesised frame by frame from the real photos of people that ship inside
the ultralytics package (``assets/zidane.jpg``, ``assets/bus.jpg``), with a slow pan and zoom,
so the whole pipeline can run offline on something that looks like video. Nothing is written
to disk.

``SyntheticCamera`` is a fake live device for tests and soak runs: it produces frames at a set
rate and can be told to stall (hang inside ``read``), refuse opens, and resume, which is how
the watchdog's reopen path is exercised without hardware.
"""

from __future__ import annotations

import logging
import threading
import time
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from pipeline.sources.readers import RawFrame, SourceError
from sapiens2_client.timing import time_base_for_fps

log = logging.getLogger(__name__)

DEMO_PHOTOS = ("zidane.jpg", "bus.jpg")


def demo_photo_paths() -> list[Path]:
    """Paths of the photos the demo clip is made from; SourceError if ultralytics lacks them."""
    try:
        import ultralytics
    except ImportError as exc:
        raise SourceError("demo source needs the ultralytics package (pip install ultralytics)") from exc
    assets = Path(ultralytics.__file__).parent / "assets"
    paths = [assets / name for name in DEMO_PHOTOS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SourceError(f"demo source: photos missing from the ultralytics install: {missing}; reinstall it")
    return paths


class DemoReader:
    """A ``seconds``-long clip at ``fps``: each photo in turn, slowly panned and zoomed."""

    def __init__(self, *, width: int = 1280, height: int = 720, fps: float = 30.0, seconds: float = 6.0) -> None:
        if width <= 0 or height <= 0 or fps <= 0 or seconds <= 0:
            raise SourceError(f"demo source: invalid size/rate {width}x{height} @ {fps} fps for {seconds} s")
        self._photos = []
        for path in demo_photo_paths():
            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise SourceError(f"demo source: cannot decode {path}; reinstall ultralytics")
            self._photos.append(np.ascontiguousarray(bgr[:, :, ::-1]))
        self.width, self.height = width, height
        self.fps: float | None = fps
        self.time_base: Fraction | None = time_base_for_fps(fps)
        self.num_frames = max(1, round(seconds * fps))
        self.frame_count: int | None = self.num_frames
        self._per_photo = -(-self.num_frames // len(self._photos))  # ceil
        self._next = 0
        self._backgrounds: dict[int, np.ndarray] = {}

    def _background(self, photo_index: int) -> np.ndarray:
        """The photo scaled to cover the frame, blurred and darkened: fills around a letterbox."""
        if photo_index not in self._backgrounds:
            photo = self._photos[photo_index]
            ph, pw = photo.shape[:2]
            scale = max(self.width / pw, self.height / ph)
            size = (max(self.width, round(pw * scale)), max(self.height, round(ph * scale)))
            cover = cv2.resize(photo, size, interpolation=cv2.INTER_AREA)
            y0, x0 = (size[1] - self.height) // 2, (size[0] - self.width) // 2
            crop = cover[y0:y0 + self.height, x0:x0 + self.width]
            self._backgrounds[photo_index] = (cv2.GaussianBlur(crop, (0, 0), 25) * 0.5).astype(np.uint8)
        return self._backgrounds[photo_index]

    def _render(self, index: int) -> np.ndarray:
        photo_index, step = divmod(index, self._per_photo)
        photo = self._photos[photo_index]
        t = step / max(1, self._per_photo - 1)
        ph, pw = photo.shape[:2]
        # Fit the whole photo (people stay in view), then zoom in 20 % while panning.
        scale = min(self.width / pw, self.height / ph) * (1.0 + 0.2 * t)
        half_w, half_h = self.width / (2 * scale), self.height / (2 * scale)
        pan = t if photo_index % 2 == 0 else 1.0 - t
        cx = half_w + (pw - 2 * half_w) * pan if pw > 2 * half_w else pw / 2
        cy = half_h + (ph - 2 * half_h) * t if ph > 2 * half_h else ph / 2
        matrix = np.array(
            [[scale, 0.0, self.width / 2 - scale * cx], [0.0, scale, self.height / 2 - scale * cy]],
            dtype=np.float64,
        )
        canvas = self._background(photo_index).copy()
        cv2.warpAffine(photo, matrix, (self.width, self.height), dst=canvas, flags=cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_TRANSPARENT)
        return canvas

    def read(self) -> RawFrame | None:
        if self._next >= self.num_frames:
            return None
        index = self._next
        self._next += 1
        return RawFrame(self._render(index), index, self.time_base)

    def close(self) -> None:
        self._next = self.num_frames


class SyntheticCamera:
    """A fake live device. ``open()`` is the opener a Source reopens through.

    Frames are (height, width, 3) uint8 whose pixels hold the frame number modulo 256, with
    pts counting frames since that open at ``1/fps``.
    """

    def __init__(self, *, width: int = 64, height: int = 48, fps: float = 200.0) -> None:
        self.width, self.height, self.fps = width, height, fps
        self.opens = 0
        self._lock = threading.Lock()
        self._stalled = threading.Event()
        self._refuse_opens = False

    def stall(self, *, refuse_opens: bool = False) -> None:
        """Hang every ``read`` (as an unplugged camera would); optionally make opens fail too."""
        with self._lock:
            self._refuse_opens = refuse_opens
            self._stalled.set()

    def resume(self) -> None:
        """Deliver frames again and accept opens."""
        with self._lock:
            self._refuse_opens = False
            self._stalled.clear()

    @property
    def stalled(self) -> bool:
        return self._stalled.is_set()

    def open(self) -> SyntheticReader:
        with self._lock:
            if self._refuse_opens:
                raise SourceError("synthetic camera: device not present (stalled with refuse_opens)")
            self.opens += 1
        return SyntheticReader(self)


class SyntheticReader:
    """One open handle on a SyntheticCamera; paced at the camera's fps."""

    def __init__(self, camera: SyntheticCamera) -> None:
        self._camera = camera
        self.fps: float | None = camera.fps
        self.time_base: Fraction | None = time_base_for_fps(camera.fps)
        self._count = 0
        self._start = time.monotonic()
        self._closed = threading.Event()

    def read(self) -> RawFrame | None:
        while self._camera.stalled:  # a hung device: block until resumed or interrupted
            if self._closed.wait(0.005):
                return None
        if self._closed.is_set():
            return None
        due = self._start + self._count / self._camera.fps
        delay = due - time.monotonic()
        if delay > 0 and self._closed.wait(delay):
            return None
        cam = self._camera
        image = np.full((cam.height, cam.width, 3), self._count % 256, dtype=np.uint8)
        pts = self._count
        self._count += 1
        return RawFrame(image, pts, self.time_base)

    def interrupt(self) -> None:
        """Unblock a pending ``read`` from another thread (it then returns None)."""
        self._closed.set()

    def close(self) -> None:
        self._closed.set()
