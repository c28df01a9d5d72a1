"""JPEG of published frames on the GPU (nvJPEG through torchvision), with the CPU encoder as fallback.

A fast path like the model's: the first frame of each size is decoded again and compared with what
the CPU encoder makes of it; an encoder that raises or disagrees is switched off for the run with
one warning, and that frame and every later one is encoded on the CPU.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from sapiens2_client import images

log = logging.getLogger(__name__)

# Mean absolute error (grey levels) a decoded JPEG may have beyond the CPU encoder's own on the same
# frame: two encoders at one quality differ by about one level; a wrong layout or colour order by tens.
EXTRA_ERROR = 3.0


class JpegEncoder:
    """JPEG of published frames on a torch device (nvJPEG through torchvision on CUDA).

    device: "auto" (the current CUDA device when there is one), a device name ("cuda" is given its
    index: the encoder runs on the sink thread, whose current device is not the run's), or None (off).
    ``encode`` returns None when the caller should use the CPU encoder instead: no device, or after
    the first failure or disagreement, which is logged once and turns this encoder off for the run.
    """

    def __init__(self, quality: int = 90, device: str | None = "auto") -> None:
        self.quality = quality
        self.device: Any = None
        if device is None:
            return
        import torch

        from stages.device import resolve_device

        if device == "auto" and not torch.cuda.is_available():
            log.info("gpu_jpeg: no CUDA device; frames are JPEG-encoded on the CPU")
            return
        self.device = resolve_device(device)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging: Any = None  # pinned (H, W, 3) uint8 host buffer, reused while the size holds
        self._checked: set[tuple[int, ...]] = set()  # frame shapes whose JPEG agreed with the CPU encoder's

    @property
    def active(self) -> bool:
        return self.device is not None

    def encode(self, image: np.ndarray) -> bytes | None:
        """(H, W, 3) RGB uint8 -> JPEG bytes, or None: use the CPU path."""
        if self.device is None:
            return None
        try:
            data = self._encode(image)
        except (ImportError, RuntimeError, ValueError, TypeError, OSError) as exc:
            # ImportError: torchvision 0.29 deprecates its image codecs (TorchCodec replaces them);
            # a release without encode_jpeg must leave the CPU encoder working.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._off(f"GPU JPEG encoding failed ({first})")
            return None
        if image.shape not in self._checked:
            reason = self._disagrees(image, data)
            if reason is not None:
                self._off(f"GPU JPEG switched off: {reason}")
                return None
            self._checked.add(image.shape)
        return data

    def _off(self, why: str) -> None:
        log.warning("%s; encoding frames on the CPU from now on", why)
        self.device = None

    def _disagrees(self, image: np.ndarray, data: bytes) -> str | None:
        """Why this JPEG of ``image`` cannot be published, or None: it must decode to the frame's
        size and be within EXTRA_ERROR grey levels of the CPU encoder's mean error on it."""
        decoded = images.decode_jpeg_rgb(data)
        if decoded is None or decoded.shape != image.shape:
            got = "nothing" if decoded is None else "x".join(map(str, decoded.shape))
            return f"its JPEG of a {'x'.join(map(str, image.shape))} frame decodes to {got}"
        cpu = images.decode_jpeg_rgb(images.encode_jpeg_rgb(image, self.quality))
        error = float(np.abs(decoded.astype(np.int16) - image).mean())
        limit = float(np.abs(cpu.astype(np.int16) - image).mean()) + EXTRA_ERROR
        if error > limit:
            return (f"its JPEG is {error:.1f} grey levels off the frame on average, the CPU encoder's "
                    f"{limit - EXTRA_ERROR:.1f} (tolerance +{EXTRA_ERROR:g})")
        return None

    def _encode(self, image: np.ndarray) -> bytes:
        import torch
        from torchvision.io import encode_jpeg

        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        host = torch.from_numpy(np.ascontiguousarray(image))
        if self.device.type == "cuda":
            if self._staging is None or self._staging.shape != host.shape:
                self._staging = torch.empty(host.shape, dtype=torch.uint8, pin_memory=True)
            self._staging.copy_(host)
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):  # off the model streams
                chw = self._staging.to(self.device, non_blocking=True).permute(2, 0, 1).contiguous()  # (3, H, W)
                # torchvision's nvJPEG encoder works on a stream of its own: the input must be ready.
                self._stream.synchronize()
                encoded = encode_jpeg(chw, quality=self.quality)
            # It writes the bitstream on the legacy default stream; copy it out on that stream too.
            data = encoded.cpu()
        else:
            data = encode_jpeg(host.permute(2, 0, 1).contiguous(), quality=self.quality)
        return data.numpy().tobytes()
