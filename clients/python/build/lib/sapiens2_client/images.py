"""Image payloads: their size read from the header bytes (before anything is decoded), and codecs.

A PNG or JPEG of a few hundred kilobytes can declare 30000x30000 pixels; decoding it first and
checking the shape afterwards lets any sender make a subscriber allocate gigabytes. ``png_info``
and ``jpeg_info`` read width, height and channels from the file header with plain byte parsing,
so the wire decoder can compare them with the declared shape and its pixel limit first.

Decoding and encoding use OpenCV when it is installed (the pipeline has it) and Pillow otherwise
(``pip install sapiens2-stream-client[images]``); both give the same pixels for PNG (lossless) and
RGB for JPEG.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Start-of-frame markers of every JPEG coding process (baseline, progressive, lossless, ...).
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # colour type -> channels (3: palette, decoded to RGB)


class ImageHeaderError(ValueError):
    """The bytes are not a PNG/JPEG whose header can be read."""


class CodecMissing(ImportError):
    """Neither OpenCV nor Pillow is installed."""


@dataclass(frozen=True)
class ImageInfo:
    width: int
    height: int
    channels: int
    bit_depth: int = 8


def png_info(data: bytes) -> ImageInfo:
    """Width, height, channels and bit depth from a PNG's IHDR chunk."""
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ImageHeaderError("not a PNG (no signature and IHDR chunk)")
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    if color not in _PNG_CHANNELS:
        raise ImageHeaderError(f"PNG colour type {color} is not valid")
    return ImageInfo(width, height, _PNG_CHANNELS[color], depth)


def jpeg_info(data: bytes) -> ImageInfo:
    """Width, height and components from a JPEG's start-of-frame segment (markers walked, nothing decoded)."""
    if data[:2] != b"\xff\xd8":
        raise ImageHeaderError("not a JPEG (no SOI marker)")
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            raise ImageHeaderError(f"JPEG marker expected at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            break
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if length < 2:
            raise ImageHeaderError("JPEG segment with a bad length")
        if marker in _SOF_MARKERS:
            if pos + 2 + length > end or length < 8:
                raise ImageHeaderError("JPEG frame header is truncated")
            precision, height, width, components = struct.unpack(">BHHB", data[pos + 4:pos + 10])
            return ImageInfo(width, height, components, precision)
        pos += 2 + length
    raise ImageHeaderError("JPEG has no frame header before its image data")


def _cv2():
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def _pil():
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def _missing() -> CodecMissing:
    return CodecMissing("decoding images needs OpenCV or Pillow: pip install 'sapiens2-stream-client[images]'")


def decode_jpeg_rgb(data: bytes) -> np.ndarray | None:
    """(H, W, 3) uint8 RGB, or None when the bytes do not decode."""
    cv2 = _cv2()
    if cv2 is not None:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        return None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    image_mod = _pil()
    if image_mod is None:
        raise _missing()
    try:
        with image_mod.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, ValueError, SyntaxError):
        return None


def decode_png_gray(data: bytes) -> np.ndarray | None:
    """(H, W) uint8 of an 8-bit grayscale PNG, or None when the bytes do not decode to one."""
    cv2 = _cv2()
    if cv2 is not None:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        return image if image is not None and image.ndim == 2 and image.dtype == np.uint8 else None
    image_mod = _pil()
    if image_mod is None:
        raise _missing()
    try:
        with image_mod.open(io.BytesIO(data)) as im:
            if im.mode != "L":
                return None
            return np.asarray(im)
    except (OSError, ValueError, SyntaxError):
        return None


def encode_jpeg_rgb(image: np.ndarray, quality: int) -> bytes:
    """(H, W, 3) uint8 RGB -> JPEG bytes."""
    cv2 = _cv2()
    if cv2 is not None:
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise ValueError("JPEG encoding failed")
        return buf.tobytes()
    image_mod = _pil()
    if image_mod is None:
        raise _missing()
    out = io.BytesIO()
    image_mod.fromarray(np.ascontiguousarray(image), "RGB").save(out, "JPEG", quality=quality)
    return out.getvalue()


def encode_png_gray(image: np.ndarray) -> bytes:
    """(H, W) uint8 -> 8-bit grayscale PNG bytes (lossless)."""
    cv2 = _cv2()
    if cv2 is not None:
        ok, buf = cv2.imencode(".png", np.ascontiguousarray(image))
        if not ok:
            raise ValueError("PNG encoding failed")
        return buf.tobytes()
    image_mod = _pil()
    if image_mod is None:
        raise _missing()
    out = io.BytesIO()
    image_mod.fromarray(np.ascontiguousarray(image), "L").save(out, "PNG")
    return out.getvalue()
